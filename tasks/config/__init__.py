"""Run configuration: one strict pydantic model per section, composed into `RunConfig`.

The same models are the Prefect flow parameters (the UI renders them as forms) and what the CLI loads from
YAML. Every default sits beside a one-line reason. One module per section; import them from here.
"""

from tasks.config.base import ConfigError, StrictModel, UserError, field_label
from tasks.config.evaluate import EvaluateConfig
from tasks.config.extract import ExtractConfig
from tasks.config.generate import (
    PROVIDER_COUNTS,
    ApiConfig,
    CountConvention,
    EmbeddedServerConfig,
    GenerateConfig,
    RequestConfig,
    SourceConfig,
    TokenPrice,
)
from tasks.config.loading import config_fields, format_validation_error, load_config, require_sources
from tasks.config.merge import MergeConfig, MergeSourceConfig
from tasks.config.reconstruct import GuidedConfig, ReconstructConfig
from tasks.config.run import ComputeConfig, OrchestrationConfig, RunConfig, VllmConfig
from tasks.config.target import ChatFormatName, TargetConfig
from tasks.config.train import DraftShape, TrainConfig
from tasks.config.validation import ValidationConfig

__all__ = [
    "PROVIDER_COUNTS",
    "ApiConfig",
    "ChatFormatName",
    "ComputeConfig",
    "ConfigError",
    "CountConvention",
    "DraftShape",
    "EmbeddedServerConfig",
    "EvaluateConfig",
    "ExtractConfig",
    "GenerateConfig",
    "GuidedConfig",
    "MergeConfig",
    "MergeSourceConfig",
    "OrchestrationConfig",
    "ReconstructConfig",
    "RequestConfig",
    "RunConfig",
    "SourceConfig",
    "StrictModel",
    "TargetConfig",
    "TokenPrice",
    "TrainConfig",
    "UserError",
    "ValidationConfig",
    "VllmConfig",
    "config_fields",
    "field_label",
    "format_validation_error",
    "load_config",
    "require_sources",
]
