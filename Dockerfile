# polychip in a container: built on Debian 12, run as a non-root user, every plugin in the image
# (cpu, emu, vulkan, template; the shm, gloo and mpi comm plugins). docs/deployment.md.
#
#   docker build -t polychip .
#   docker run --rm -p 30000:30000 -v /srv/models:/models:ro polychip \
#       --model-path /models/qwen2.5-7b-instruct-q4_k_m.gguf
#
# The server listens on 0.0.0.0 here (a container's 127.0.0.1 cannot be reached from outside),
# and its port opens only once the model is loaded. Arguments after the image name are
# `polychip serve` flags; POLYCHIP_* variables and a mounted --config work as outside.

FROM debian:12-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git ca-certificates \
      nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev \
      libpcre2-dev libboost-dev libopenmpi-dev libgloo-dev \
      libvulkan-dev glslc \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The binary, libpolychip.so and the plugins only (no tests); installed under /opt/polychip,
# where the binary finds its plugins (/opt/polychip/lib/polychip) by itself.
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPOLYCHIP_BUILD_TESTS=OFF \
      -DCMAKE_INSTALL_PREFIX=/opt/polychip \
 && cmake --build /build --target polychip plugins \
 && cmake --install /build --component Unspecified \
 && cmake --install /build --component library \
 && cmake --install /build --component plugins

FROM debian:12-slim
# The run-time libraries of the binary and the plugins; Mesa's Vulkan drivers (lavapipe, and the
# GPU drivers Mesa has) for the vulkan plugin.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libspdlog1.10 libfmt9 libyaml-cpp0.7 libpcre2-8-0 \
      libopenmpi3 libgloo0 libvulkan1 mesa-vulkan-drivers \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/polychip /opt/polychip
# Not root, and the plugin folder is root's and not writable by others: the loader refuses
# plugins in folders others may write.
RUN useradd --system --uid 10001 --home-dir /var/lib/polychip --create-home polychip \
 && chmod -R go-w /opt/polychip
USER polychip
WORKDIR /var/lib/polychip
ENV PATH=/opt/polychip/bin:$PATH
EXPOSE 30000
ENTRYPOINT ["polychip", "serve", "--host", "0.0.0.0", "--port", "30000"]
