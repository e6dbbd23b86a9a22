"""How much a model needs: read its shape, size weights, KV cache, activations and engine
overhead per GPU (`estimate.estimate_model`), and turn a budget back into engine settings
(`budget`). Pure arithmetic except `checkpoint.py`, which reads model files.
"""

from cohabit.estimate.errors import EstimateError, InvalidSetting, ModelNotFound, UnsupportedModel
from cohabit.estimate.estimate import Estimate, Source, estimate_model, estimate_shape
from cohabit.estimate.settings import EngineSettings, KvSizing

__all__ = [
    "EngineSettings",
    "Estimate",
    "EstimateError",
    "InvalidSetting",
    "KvSizing",
    "ModelNotFound",
    "Source",
    "UnsupportedModel",
    "estimate_model",
    "estimate_shape",
]
