"""Device-attached runners: toolchains that build and time candidate sub-models.

Nothing here imports a heavy toolchain package (onnxruntime, openvino, vela, litert) at module
import time; `runners.registry` loads toolchains by name on demand.
"""
