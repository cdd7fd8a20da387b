# vitkit serve in a container: CPU PyTorch (the version constraints.txt pins), the serve extra,
# a non-root user, the model mounted read-only at /model, a HEALTHCHECK on /health.
#
#   docker build -t vitkit-serve:0.1.0 .
#   docker run --rm -p 8000:8000 -v "$PWD/runs/mnist:/model:ro" -e VITKIT_API_KEY=KEY vitkit-serve:0.1.0
#
# Extra arguments go after the image name and replace CMD, so repeat its drain timeout with them,
# e.g. `... vitkit-serve --workers 2 --drain-timeout 8` (without it: 30 s, past docker stop's 10).
# EXTRAS=serve,onnx adds ONNX Runtime (for --fast / --engine onnxruntime).
#
# The base image: pin it by digest for a reproducible build. This file cannot know a digest it
# has not pulled, so none is written here; take the one your registry serves and pass it:
#   docker buildx imagetools inspect python:3.11-slim   # (Digest: sha256:...)
#   docker build --build-arg BASE_IMAGE=python:3.11-slim@sha256:<digest> -t vitkit-serve:0.1.0 .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG EXTRAS=serve
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_WAIT_POLICY=PASSIVE \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
# CPU wheels of torch from PyTorch's index (2.13.0+cpu satisfies the constraint torch==2.13.0);
# everything else from PyPI at the versions constraints.txt pins.
RUN pip install -c constraints.txt \
        --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple \
        ".[${EXTRAS}]" \
    && python -c "import torch, fastapi, uvicorn; assert not torch.cuda.is_available()" \
    && rm -rf /src

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin vitkit
USER 10001:10001
WORKDIR /home/vitkit

# The model: a run directory, a checkpoint or an engine directory, mounted read-only.
VOLUME ["/model"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)"]

# SIGTERM drains (--drain-timeout, under the runtime's stop timeout: docker stop waits 10 s; with
# --workers a model process still running 1 s after the drain timeout is killed: 8 + 1 < 10).
STOPSIGNAL SIGTERM
ENTRYPOINT ["vitkit", "serve", "/model", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--drain-timeout", "8"]
