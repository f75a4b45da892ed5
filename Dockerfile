# kiln service image: API, CPU worker and (built with a CUDA torch) GPU worker.
#   docker build -t kiln .                                   # CPU torch: api, cpu-worker
#   docker build -t kiln-gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.11.*
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    KILN_KERNEL_DIR=/home/kiln/.cache/kiln/kernels

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
