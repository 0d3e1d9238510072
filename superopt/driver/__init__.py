"""The driver: one ``optimize`` pipeline behind the three doors (``superopt optimize``, the
Python API and ``torch.compile(backend="superopt")``), with one set of defaults
(:class:`Options`), its passes as data (:data:`PASSES`) and one report.

>>> from superopt.driver import Options, PASSES
>>> [p.name for p in PASSES][:3]
['fold + merge duplicates', 'search', 'keep if cheaper']
"""

from .._lazy import lazy_exports

#: public name -> submodule, imported on first use (the backend pulls in Inductor: seconds)
__getattr__ = lazy_exports(__name__, {
    "Options": ".options",
    "OptionError": ".options",
    "DEFAULT_MIN_GAIN": ".options",
    "DEFAULT_TOLERANCE": ".options",
    "PASSES": ".passes",
    "Pass": ".passes",
    "CodePlan": ".passes",
    "LoadedModel": ".model",
    "load_model": ".model",
    "optimize": ".pipeline",
    "Optimized": ".pipeline",
    "OptimizeReport": ".pipeline",
    "relative_error": ".pipeline",
    "write_model": ".write",
    "write_onnx": ".write",
    "superopt_backend": ".backend",
})

__all__ = ["Options", "OptionError", "DEFAULT_MIN_GAIN", "DEFAULT_TOLERANCE", "PASSES", "Pass", "CodePlan",
           "LoadedModel", "load_model", "optimize", "Optimized", "OptimizeReport", "relative_error", "write_model",
           "write_onnx", "superopt_backend"]
