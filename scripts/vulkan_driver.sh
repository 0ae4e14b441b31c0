#!/usr/bin/env bash
# A Vulkan adapter for LiteRT's GPU accelerator (ML Drift over WebGPU/Dawn), installed by `make env`.
# A machine with a GPU and its Vulkan driver keeps it. Without one, Mesa's software driver (lavapipe)
# serves, but only from version 25: Dawn refuses 22.3 (Debian 12's own) with "No adapters found".
# As root on Debian 12 (from bookworm-backports) or 13 this installs mesa-vulkan-drivers >= 25 and
# vulkan-tools; elsewhere it says what to install and leaves the rest to verify_gpu, which then fails
# with one line naming the fix. Never fails `make env` itself.
set -u
MIN_MESA=25

has_gpu_device() {  # a Vulkan device that is not Mesa's CPU rasterizer
  command -v vulkaninfo >/dev/null 2>&1 || return 1
  vulkaninfo --summary 2>/dev/null | grep -E '^\s*deviceName' | grep -vq llvmpipe
}

mesa_major() {
  dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null | sed -E 's/^([0-9]+:)?([0-9]+).*/\2/'
}

if has_gpu_device; then
  echo "vulkan: a GPU device is present: $(vulkaninfo --summary 2>/dev/null | grep -E '^\s*deviceName' | head -1 | sed 's/.*= //')"
  exit 0
fi
major=$(mesa_major)
if [ -n "$major" ] && [ "$major" -ge "$MIN_MESA" ] && command -v vulkaninfo >/dev/null 2>&1; then
  echo "vulkan: Mesa's lavapipe $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) serves as the adapter"
  exit 0
fi

hint="install Mesa's Vulkan driver >= $MIN_MESA (Debian: mesa-vulkan-drivers, on Debian 12 from bookworm-backports) and vulkan-tools"
debian=$(cut -d. -f1 /etc/debian_version 2>/dev/null)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || { [ "$debian" != 12 ] && [ "$debian" != 13 ]; }; then
  echo "vulkan: WARNING: no usable Vulkan adapter and no way to install one here (not root on Debian 12/13): $hint; verify_gpu will fail until then" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
target=()
if [ "$debian" = 12 ]; then
  list=/etc/apt/sources.list.d/bookworm-backports.sources
  if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$list"
  fi
  target=(-t bookworm-backports)
fi
echo "vulkan: installing mesa-vulkan-drivers >= $MIN_MESA and vulkan-tools (Debian $debian)"
if apt-get update -qq && apt-get install -y -qq "${target[@]}" mesa-vulkan-drivers vulkan-tools >/dev/null; then
  echo "vulkan: installed mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)"
else
  echo "vulkan: WARNING: the install failed: $hint; verify_gpu will fail until then" >&2
fi
exit 0
