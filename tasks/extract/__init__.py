"""Extract stage: the target's aux and final hidden states for EAGLE-3, in bf16 safetensors shards."""
