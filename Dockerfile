# The ranksight node agent (`ranksight exporter`): Python slim + the project, no torch.
#   docker build -t ranksight-agent .
# docker-compose.yml runs it with the host's network, PIDs, /proc and /sys (read-only),
# and with the GPUs in its `gpu` profile.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY . .
# A venv so the runtime stage copies exactly what `pip install .` installed.
RUN python -m venv /opt/ranksight \
 && /opt/ranksight/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/ranksight/bin/pip install --no-cache-dir . \
 && ! /opt/ranksight/bin/python -c "import torch" 2>/dev/null

FROM python:3.11-slim-bookworm
COPY --from=build /opt/ranksight /opt/ranksight
ENV PATH=/opt/ranksight/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Like node_exporter's image: no root needed to read /proc, /sys and NVML.
USER 65534:65534
EXPOSE 9945/tcp 9946/udp
ENTRYPOINT ["ranksight", "exporter"]
