"""The vLLM backend (the optional extra ``unsee[vllm]``): ``engine`` (:class:`~unsee.impl.engines.vllm.engine.VllmEngine`),
``models`` (``load_vllm``), ``adapter`` (every vLLM call)."""
