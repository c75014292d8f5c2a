"""Sequence mixers, the pre-norm block, the small LM and compression models, and the MIXERS registry.

    config = ModelConfig(vocab_size=16, mixer="attention", qkv_conv="dynamic_lowrank")
    model = build_model(config)
    logits = model(input_ids, doc_ids=None)   # [B, T, V]
    save(model, "model.pt"); model = load("model.pt")   # weights + config in one file
"""

from mixlab.models.checkpoint import load, save
from mixlab.models.config import PRESETS, ModelConfig, preset_config
from mixlab.models.layers import Block, Mixer, RMSNorm, SwiGLU
from mixlab.models.lm import CompressionAutoencoder, LanguageModel, build_model, count_parameters
from mixlab.models.mixers import (
    MIXERS,
    claims_document_blindness,
    layer_mixers,
    mixer_class,
    mixer_origins,
    mixer_pattern,
    pattern_classes,
    resolve_mixer,
)

__all__ = [
    "MIXERS",
    "PRESETS",
    "Block",
    "CompressionAutoencoder",
    "LanguageModel",
    "Mixer",
    "ModelConfig",
    "RMSNorm",
    "SwiGLU",
    "build_model",
    "claims_document_blindness",
    "count_parameters",
    "layer_mixers",
    "load",
    "mixer_class",
    "mixer_origins",
    "mixer_pattern",
    "pattern_classes",
    "preset_config",
    "resolve_mixer",
    "save",
]
