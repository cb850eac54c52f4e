#!/bin/bash
# Make lace's base image, localhost/lace-base:<key>, from Debian bookworm without a registry: mmdebstrap
# writes a minimal root filesystem (python3 and libbpf1, the agent's two runtime needs) into a
# tarball and `podman import` turns it into an image. Both stages of the Containerfile start from it
# (the build stage adds the compilers, the final one only the built venv and objects).
#
# The key is a hash of what goes into the base (suite, mirrors, packages, dpkg's filters): a changed
# package list or mirror makes a new base, an unchanged one reuses the tarball (build/image/) and
# the imported image, so only the first run pays for mmdebstrap (2-3 minutes here, mostly the
# download). Delete the tarball and `podman rmi` the image to refresh the base's packages.
#
# Usage: deploy/image/base.sh [CACHE_DIR]    prints the base image's name on stdout
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-$here/../../build/image}
suite=bookworm
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
# python3: bookworm's 3.11 (lace needs >= 3.11); libbpf1: lace.bpf loads libbpf.so.1 with ctypes
packages=python3,libbpf1

# no documentation, man pages, locales or info (a few MB each, of no use in a container); the
# copyright files stay
dpkgopts=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
          --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
          --dpkgopt='path-exclude=/usr/share/info/*')

# (bump the last word to make a new base from the same settings, e.g. after a change to the hooks)
key=$(printf '%s\n' "$suite" "$mirror" "$security" "$packages" "${dpkgopts[@]}" merged-usr-hook | sha256sum | cut -c1-12)
image=localhost/lace-base:$suite-$key
tarball=$cache/lace-base-$suite-$key.tar

if podman image exists "$image"; then
  echo "$image"
  exit 0
fi
for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "base.sh: $tool is missing (make install adds it)" >&2; exit 1; }
done
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  # mmdebstrap picks its output format from the file name, so the partial file ends in .tar too
  echo "base.sh: building $suite with mmdebstrap into $tarball" >&2
  # minbase: essential packages and apt only; apt's lists are left out (the build stage updates
  # them). The merged-usr hook makes /usr merged itself and marks it so with an empty
  # usr-is-merged; without it apt satisfies init-system-helpers with usrmerge and 50 MB of perl.
  mmdebstrap --variant=minbase --include="$packages" --quiet "${dpkgopts[@]}" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$suite" "$cache/.partial-$key.tar" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main" >&2
  mv "$cache/.partial-$key.tar" "$tarball"
  # an earlier key's tarball is of no further use
  find "$cache" -maxdepth 1 -name "lace-base-$suite-*.tar" ! -name "${tarball##*/}" -delete
fi
podman import --quiet \
  --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --message "lace base: Debian $suite minbase + $packages (deploy/image/base.sh)" \
  "$tarball" "$image" >/dev/null
echo "$image"
