"""Shared fixtures: one Prefect test harness per session, the demo target, real tokenizers."""

import os
import tempfile

# Prefect reads its home when first imported: keep the test database out of the project.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="draftsmith-prefect-"))

import pytest  # noqa: E402

import tasks  # noqa: E402,F401  (offline defaults)
from tasks.config import TargetConfig  # noqa: E402
from tasks.target.assets import DEEPSEEK_TOKENIZER  # noqa: E402


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API for the whole session (request it in tests that run flows)."""
    from prefect.settings import PREFECT_RUNNER_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings({PREFECT_RUNNER_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture(scope="session")
def demo_target() -> TargetConfig:
    return TargetConfig()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_target):
    from tasks.target.loader import load_tokenizer

    return load_tokenizer(demo_target)


@pytest.fixture(scope="session")
def demo_model(demo_target):
    import torch

    from tasks.target.loader import load_model

    torch.manual_seed(0)
    return load_model(demo_target, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def deepseek_target() -> TargetConfig:
    return TargetConfig(model="deepseek-ai/DeepSeek-V4", source="tokenizer_json", path=DEEPSEEK_TOKENIZER.spec)


@pytest.fixture(scope="session")
def deepseek_tokenizer(deepseek_target):
    from tasks.target.loader import load_tokenizer

    return load_tokenizer(deepseek_target)


@pytest.fixture(scope="session")
def sampled_generations(demo_tokenizer, demo_model):
    """Generation rows sampled from the demo model (T=0.7) with true prompt/completion ids and logprob bytes."""
    import torch

    from tasks.reconstruct.tokens import resolve_end_of_turn
    from tasks.validate.sample import sample_generations

    torch.set_num_threads(1)
    prompts = [
        [{"role": "user", "content": q}]
        for q in [
            "List three prime numbers.",
            "Write a haiku about rain.",
            "Give a Python function that adds two numbers.",
            "What is the boiling point of water?",
            "Name two colours of the rainbow.",
            "Explain recursion in one sentence.",
        ]
    ]
    end_of_turn = resolve_end_of_turn(demo_tokenizer, None, "template")
    return sample_generations(demo_model, demo_tokenizer, prompts, end_of_turn, max_new_tokens=24, batch_size=6)
