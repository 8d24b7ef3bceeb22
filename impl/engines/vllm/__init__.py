"""The vLLM backend (the optional extra ``unsee[vllm]``): ``engine`` (:class:`VllmEngine`),
``models`` (``load_vllm``), ``adapter`` (every vLLM call)."""
