# kiln service image: API, CPU worker and (built with a CUDA torch) GPU worker.
#   docker build -t kiln .                                                # api, cpu-worker
#   docker build -t kiln-gpu --build-arg TORCH_INDEX_URL=https://pypi.org/simple .   # gpu-worker
#
# One torch pin for every image and for `make install` (the Makefile's TORCH_PIN): torch's
# major.minor is part of every tuning key, so an API, its workers and its clients on other
# torch versions would never share an entry. Only the build differs: the CPU image takes the
# CPU wheel (small; builds and Triton-interpreter checks need no CUDA), the GPU image the
# package index's default Linux wheel, which is built with CUDA and brings its CUDA libraries
# and the matching Triton.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    KILN_KERNEL_DIR=/home/kiln/.cache/kiln/kernels

# Triton compiles a small C launcher for each kernel it loads on a GPU: that needs a C
# compiler and libc headers at run time, which the slim image lacks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 kiln
WORKDIR /app

# torch first, from the index that matches the image's purpose (its own layer: it is large).
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"

COPY pyproject.toml README.md ./
COPY compiler compiler
COPY tuner tuner
COPY service service
COPY kiln kiln
COPY migrations migrations
RUN pip install ".[service]"

USER kiln
EXPOSE 8000
# Migrations are their own step (`kiln db upgrade`); docker-compose runs it before serving.
CMD ["kiln", "serve", "--host", "0.0.0.0", "--port", "8000"]
