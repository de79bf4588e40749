# memstream service image: the same locked dependencies as scripts/bootstrap.sh.
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORKDIR /app
COPY requirements.lock ./
RUN pip install --no-cache-dir "$(grep -E '^torch==' requirements.lock)" && pip install --no-cache-dir -r requirements.lock
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY streams ./streams
COPY services ./services
COPY infra ./infra
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e .
ENV MEMSTREAM_DATA_DIR=/data MEMSTREAM_API_HOST=0.0.0.0
VOLUME /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=30 CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"
CMD ["memstream", "serve", "--port", "8080"]
