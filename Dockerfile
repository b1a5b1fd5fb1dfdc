# One image for the user code, the Dagster webserver and the daemon of docker-compose.yml.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    VISION_RAG_HOME=/var/lib/vision_rag

# OCR: Tesseract with the common languages (media_enrichment.ocr.languages picks among them).
RUN apt-get update \
    && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng tesseract-ocr-chi-sim \
       tesseract-ocr-chi-tra tesseract-ocr-rus tesseract-ocr-ukr tesseract-ocr-deu tesseract-ocr-fra \
       tesseract-ocr-spa tesseract-ocr-ita tesseract-ocr-por tesseract-ocr-jpn tesseract-ocr-kor \
    && rm -rf /var/lib/apt/lists/*

# torch first, from the CPU wheel index, so sentence-transformers does not pull a CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /opt/dagster/app

# Dependencies in their own layer (rebuilt only when pyproject.toml changes), then the code.
# The 8.x Elasticsearch client talks to 8.x and 9.x clusters; a 9.x client is refused by 8.x ones.
COPY pyproject.toml README.md ./
RUN mkdir vision_rag_pipeline && touch vision_rag_pipeline/__init__.py \
    && pip install . "elasticsearch>=8.13,<9" \
    && pip uninstall -y vision_rag_pipeline && rm -rf vision_rag_pipeline build
COPY vision_rag_pipeline ./vision_rag_pipeline
RUN pip install --no-deps . && rm -rf build

COPY workspace-docker.yaml ./
COPY docker/dagster.yaml ${DAGSTER_HOME}/dagster.yaml

# Named volumes mounted on these directories start with this ownership.
RUN useradd --create-home --uid 1000 dagster \
    && mkdir -p ${DAGSTER_HOME}/storage ${VISION_RAG_HOME}/inbox \
    && chown -R dagster:dagster ${DAGSTER_HOME} ${VISION_RAG_HOME}
USER dagster

EXPOSE 3000 4000
