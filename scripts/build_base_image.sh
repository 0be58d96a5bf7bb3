#!/usr/bin/env bash
# Make the two base images the Containerfile builds FROM, out of Debian bookworm's own
# packages (debootstrap from Debian's mirror, then bookworm-security's updates; no container
# registry is needed):
#
#   localhost/a2agw-base:bookworm-KEY-build  python3, python3-venv (pip via ensurepip), procps and
#                                            systemd: the Containerfile's build stage, and the
#                                            systemd unit's test (tests/deploy/test_systemd_unit.py)
#   localhost/a2agw-base:bookworm-KEY        python3 only, no docs, no apt lists: the runtime
#
# KEY is the hash of this script, so a changed recipe makes new images. Both root filesystems
# are kept as tarballs in ${A2AGW_IMAGES:-/var/cache/a2agw/images}, outside the clone, and
# imported into podman's storage when they are missing there: a clean CI clone reuses them.
# Updates are those of the day the tarballs were made: delete them to take newer ones. The
# package lists of both images are kept beside them (*.packages). The script prints the
# runtime image's name on stdout (the build image is that name with "-build"); what it did
# goes to stderr.
set -euo pipefail

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
CACHE="${A2AGW_IMAGES:-/var/cache/a2agw/images}"
KEY="$(sha256sum "$0" | cut -c1-12)"
RUNTIME="localhost/a2agw-base:$SUITE-$KEY"
BUILD="$RUNTIME-build"
RUNTIME_TAR="$CACHE/a2agw-base-$SUITE-$KEY.tar"
BUILD_TAR="$CACHE/a2agw-base-$SUITE-$KEY-build.tar"
# Set in every image: Debian's own PATH, and UTF-8 without a locales package.
CHANGES=(--change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  --change "ENV LANG=C.UTF-8" --change 'CMD ["/bin/sh"]')

if podman image exists "$RUNTIME" && podman image exists "$BUILD"; then
  echo "build_base_image.sh: reused $RUNTIME and $BUILD (podman storage)" >&2
  echo "$RUNTIME"
  exit 0
fi

if ! [ -s "$RUNTIME_TAR" ] || ! [ -s "$BUILD_TAR" ]; then
  command -v debootstrap >/dev/null || {
    echo "build_base_image.sh: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
  }
  mkdir -p "$CACHE"
  WORK="$(mktemp -d "$CACHE/.work-XXXXXX")"
  trap 'umount "$WORK"/*/proc 2>/dev/null || true; rm -rf "$WORK"' EXIT
  started=$(date +%s)
  # minbase: Debian's "required" packages only (dpkg, apt, coreutils, passwd for useradd).
  nice -n 10 debootstrap --variant=minbase --include=python3 \
    "$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    tail -20 "$WORK/debootstrap.log" >&2
    exit 1
  }
  cat >"$WORK/rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SOURCES
  in_root() { # run a command in the root filesystem $1 (with /proc, as dpkg's scripts want)
    local root="$1" status=0
    shift
    mount -t proc proc "$root/proc"
    chroot "$root" env DEBIAN_FRONTEND=noninteractive "$@" >>"$WORK/apt.log" 2>&1 || status=$?
    umount "$root/proc"
    [ "$status" -eq 0 ] || { tail -20 "$WORK/apt.log" >&2; return "$status"; }
  }
  in_root "$WORK/rootfs" sh -c 'apt-get -qq update && apt-get -qq -y upgrade'
  cp -a "$WORK/rootfs" "$WORK/build"
  in_root "$WORK/build" apt-get -qq -y install --no-install-recommends \
    python3-venv systemd systemd-sysv procps
  for root in rootfs build; do
    # What no container needs: package lists and caches, docs, logs, device nodes.
    rm -rf "$WORK/$root"/var/lib/apt/lists/* "$WORK/$root"/var/cache/apt/* \
      "$WORK/$root"/usr/share/doc/* "$WORK/$root"/usr/share/man/* "$WORK/$root"/usr/share/info/* \
      "$WORK/$root"/usr/share/locale/* "$WORK/$root"/var/log/* "$WORK/$root"/dev/* \
      "$WORK/$root"/tmp/* "$WORK/$root"/root/.cache
  done
  chroot "$WORK/rootfs" dpkg-query -W -f '${Package} ${Version}\n' >"${RUNTIME_TAR%.tar}.packages"
  chroot "$WORK/build" dpkg-query -W -f '${Package} ${Version}\n' >"${BUILD_TAR%.tar}.packages"
  tar --numeric-owner -C "$WORK/build" -cf "$BUILD_TAR.part" . && mv "$BUILD_TAR.part" "$BUILD_TAR"
  tar --numeric-owner -C "$WORK/rootfs" -cf "$RUNTIME_TAR.part" . && mv "$RUNTIME_TAR.part" "$RUNTIME_TAR"
  echo "build_base_image.sh: made $RUNTIME_TAR and $BUILD_TAR in $(($(date +%s) - started)) s" >&2
else
  echo "build_base_image.sh: reused $RUNTIME_TAR and $BUILD_TAR (cache)" >&2
fi

podman import -q "${CHANGES[@]}" "$BUILD_TAR" "$BUILD" >/dev/null
podman import -q "${CHANGES[@]}" "$RUNTIME_TAR" "$RUNTIME" >/dev/null
echo "build_base_image.sh: imported $RUNTIME and $BUILD into podman" >&2
echo "$RUNTIME"
