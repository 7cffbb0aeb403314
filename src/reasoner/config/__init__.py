"""Configuration: one pydantic model per stage (stages.py), the sections they share
(sections.py), the generating stages' sections (generation.py), the offline objectives' tagged
union (objectives.py) with its corrections (corrections.py) and loading YAML files with
`key.sub=value` overrides (files.py). Everything is re-exported here: `from reasoner.config
import SFTConfig, load` is the import users and stages write.
"""

from reasoner.config.corrections import CORRECTIONS, CorrectionConfig
from reasoner.config.files import ConfigError, Strict, dump, load, parse_overrides
from reasoner.config.generation import (
    JudgeConfig,
    RayConfig,
    SamplingConfig,
    ServerConfig,
    VLLMConfig,
)
from reasoner.config.objectives import (
    OBJECTIVE_MODELS,
    CISPOObjective,
    DAPOObjective,
    DiscountedObjective,
    GSPOObjective,
    OAPLObjective,
    ObjectiveConfig,
    OREALObjective,
    PCLObjective,
    ProRLObjective,
    RFTObjective,
)
from reasoner.config.sections import (
    TEMPLATE_PRESETS,
    DataConfig,
    Input,
    LoraSettings,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TemplateConfig,
    TinyModelConfig,
    TrainedModelConfig,
)
from reasoner.config.stages import (
    DecontamConfig,
    EvalConfig,
    FilterConfig,
    InferConfig,
    OfflineConfig,
    SFTConfig,
    SynthConfig,
    TinyConfig,
    TrainerConfig,
    VerifyConfig,
)

__all__ = [
    "CORRECTIONS", "OBJECTIVE_MODELS", "TEMPLATE_PRESETS", "CISPOObjective", "ConfigError",
    "CorrectionConfig", "DAPOObjective", "DataConfig", "GSPOObjective", "OAPLObjective",
    "DecontamConfig", "DiscountedObjective", "EvalConfig", "FilterConfig", "InferConfig", "Input",
    "JudgeConfig", "LoraSettings", "ModelConfig", "ObjectiveConfig", "OfflineConfig", "OptimConfig",
    "OREALObjective", "PCLObjective", "ProRLObjective", "RayConfig", "RFTObjective", "RunConfig",
    "ServerConfig",
    "SamplingConfig", "SFTConfig", "Strict", "SynthConfig", "TemplateConfig", "TinyConfig",
    "TinyModelConfig", "TrainedModelConfig", "TrainerConfig", "VerifyConfig", "VLLMConfig", "dump", "load", "parse_overrides",
]
