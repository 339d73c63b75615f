# dpclip image: builds the project and runs the default pipeline (`dvc repro`).
#   docker build -t dpclip .                                  # CPU (default)
#   docker build --build-arg VARIANT=cuda -t dpclip:cuda .    # CUDA base and CUDA torch
#   docker run --rm -v "$PWD/out:/app/reports" dpclip         # the comparison lands in ./out
ARG VARIANT=cpu

FROM python:3.11-slim AS base-cpu
ENV TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
RUN apt-get update && apt-get install -y --no-install-recommends make git \
    && rm -rf /var/lib/apt/lists/*

FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04 AS base-cuda
ENV TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu126"
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv make git \
    && ln -sf /usr/bin/python3.11 /usr/local/bin/python3 \
    && rm -rf /var/lib/apt/lists/*

FROM base-${VARIANT}
WORKDIR /app
ENV PYTHONUNBUFFERED=1
COPY pyproject.toml requirements.lock Makefile README.md ./
COPY src ./src
RUN make install TORCH_PIP_ARGS="$TORCH_PIP_ARGS"
COPY . .
# DVC needs a git repository (or --no-scm); the image gets a fresh one
RUN (git init -q && git add -A && git -c user.email=d@p -c user.name=dpclip commit -qm image) \
    || dvc init --no-scm -f
ENV PATH=/app/.venv/bin:$PATH
CMD ["sh", "-c", "dvc repro && cat reports/comparison.md"]
