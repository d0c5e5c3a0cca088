#!/usr/bin/env bash
# Installs everything the NetReduce lab needs on a fresh Debian machine, idempotently:
#   1. Debian packages (qemu, rdma-core, pyverbs, perftest, iproute2, ethtool, ...)
#   2. a Debian kernel >= 7.1 with its modules (per-namespace rdma_rxe), unpacked under
#      /lib/modules/<ver>; the system's apt sources are left untouched
#   3. a Python venv in .venv with this project installed and Debian's pyverbs importable
# Usage: scripts/install.sh [--no-kernel] [--no-venv]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MIN_KERNEL=7.1
APT_DIR=${NR_APT_DIR:-/var/cache/netreduce-apt}
VENV=${NR_VENV:-$ROOT/.venv}
want_kernel=1 want_venv=1
for a in "$@"; do
  case $a in
    --no-kernel) want_kernel=0 ;;
    --no-venv) want_venv=0 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done

step() { printf '\n==> [install] %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "install.sh: must run as root (apt-get, /lib/modules)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive

DEB_PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils
          python3-pyverbs python3-venv perftest iproute2 ethtool kmod iputils-ping tcpdump
          procps)
missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "Debian packages: installing ${missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  step "Debian packages: all ${#DEB_PKGS[@]} present"
fi

# --- a kernel with per-namespace rxe -----------------------------------------------------
kernel_ok() {  # a /lib/modules/<ver> with vmlinuz and rdma_rxe, ver >= MIN_KERNEL
  local d
  for d in /lib/modules/*/; do
    d=${d%/}; local v=${d##*/}
    [ -f "$d/vmlinuz" ] || continue
    [ -n "$(find "$d" -name 'rdma_rxe.ko*' -print -quit)" ] || continue
    dpkg --compare-versions "${v%%+*}" ge "$MIN_KERNEL" && { echo "$v"; return 0; }
  done
  return 1
}
if [ $want_kernel = 1 ]; then
  if ver=$(kernel_ok); then
    step "kernel: $ver already unpacked under /lib/modules"
  else
    step "kernel: resolving the newest Debian linux-image-amd64 >= $MIN_KERNEL (private apt dir $APT_DIR)"
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/pkgs"
    # Reuse the mirror the system is already configured with; only the suites differ.
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '$1=="deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$uri" ] || { echo "install.sh: cannot find a Debian mirror in /etc/apt sources" >&2; exit 1; }
    key=/usr/share/keyrings/debian-archive-keyring.gpg
    {
      echo "deb [signed-by=$key] $uri trixie-backports main"
      echo "deb [signed-by=$key] $uri sid main"
    } > "$APT_DIR/sources.list"
    O=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o Dir::Etc::sourceparts=-
       -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
       -o Dir::State::status=/dev/null -o APT::Get::List-Cleanup=0)
    apt-get "${O[@]}" update -q
    # Newest metapackage version >= MIN_KERNEL from any of the suites above.
    meta=$(apt-cache "${O[@]}" madison linux-image-amd64 | awk -F'|' '{gsub(/ /,"",$2); print $2}' \
           | sort -V -r | head -1)
    [ -n "$meta" ] || { echo "install.sh: no linux-image-amd64 found in trixie-backports/sid" >&2; exit 1; }
    dpkg --compare-versions "$meta" ge "$MIN_KERNEL" || {
      echo "install.sh: newest linux-image-amd64 is $meta, need >= $MIN_KERNEL" >&2; exit 1; }
    img=$(apt-cache "${O[@]}" show "linux-image-amd64=$meta" | sed -n 's/^Depends:.*\(linux-image-[0-9][^ ,]*-amd64\).*/\1/p' | head -1)
    kver=${img#linux-image-}
    step "kernel: linux-image-amd64 $meta -> $kver; downloading linux-binary-$kver linux-modules-$kver"
    (cd "$APT_DIR/pkgs" && rm -f ./*.deb && apt-get "${O[@]}" download "linux-binary-$kver" "linux-modules-$kver")
    tmp=$(mktemp -d)
    for deb in "$APT_DIR"/pkgs/*.deb; do dpkg -x "$deb" "$tmp"; done
    mkdir -p "/lib/modules/$kver"
    cp -a "$tmp/usr/lib/modules/$kver/." "/lib/modules/$kver/"
    [ -f "/lib/modules/$kver/vmlinuz" ] || cp "$tmp/boot/vmlinuz-$kver" "/lib/modules/$kver/vmlinuz"
    rm -rf "$tmp" "$APT_DIR"/pkgs/*.deb
    depmod -a "$kver"
    ver=$(kernel_ok) || { echo "install.sh: kernel $kver unpacked but has no vmlinuz or rdma_rxe" >&2; exit 1; }
    step "kernel: $ver ready"
  fi
fi

# --- the venv ----------------------------------------------------------------------------
if [ $want_venv = 1 ]; then
  py=/usr/bin/python3   # Debian's python: the one python3-pyverbs is built for
  if [ ! -x "$VENV/bin/python" ]; then
    step "venv: creating $VENV with $py"
    "$py" -m venv "$VENV"
  else
    step "venv: $VENV exists"
  fi
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  pyverbs_dir=$("$py" -c 'import pyverbs, os; print(os.path.dirname(pyverbs.__file__))')
  ln -sfn "$pyverbs_dir" "$site/pyverbs"
  step "venv: installing the project (pip install -e '.[dev]')"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e "$ROOT[dev]"
  "$VENV/bin/python" -c 'import pyverbs.device, numpy, scapy, grpc, virtme_ng' \
    || { echo "install.sh: venv is incomplete" >&2; exit 1; }
  step "venv: ready ($VENV/bin/python)"
fi
step "done"
