"""Tiny random-weight models of real classes (transformers Idefics3 / SmolVLM and Qwen2.5-VL,
diffusers SD3 / FLUX, vLLM-servable checkpoints), built offline with tokenizers trained here.

Part of the library, not only of the tests: ``policy.model: tiny`` (the VLM quickstart),
``policy.model: tiny-qwen2.5-vl`` (the video-QA demo) and ``policy.backbone: tiny`` run on them, so
that every quickstart works on a machine that cannot reach a model hub, and the tests exercise the
real loading code (``from_pretrained`` on a saved tiny model) rather than a mock.
"""
