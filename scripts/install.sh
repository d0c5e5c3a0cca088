#!/usr/bin/env bash
# Installs everything the NetReduce lab needs on a fresh Debian machine, idempotently:
#   1. Debian packages (qemu, rdma-core, pyverbs, perftest, iproute2, ethtool, ...)
#   2. a Debian kernel >= 7.1 with its modules (per-namespace rdma_rxe), unpacked under
#      /lib/modules/<ver>; the system's apt sources are left untouched
#   3. p4c and BMv2 (optional: the BMv2 target) when missing: from ../shared/p4-toolchain
#      (its install.sh, prefix /opt/p4) when that exists, else from the prefix, toolchain
#      directory or archive named by --p4 or $NR_P4_TOOLCHAIN; else one line says how to get
#      them and the rest goes on. Their programs get links in $NR_BIN_DIR (/usr/local/bin),
#      so every shell, script and test finds them ($NR_P4_PREFIX: another prefix than /opt/p4)
#   4. a Python venv in .venv with this project installed (with p4runtime-shell, the `bmv2`
#      extra, when BMv2 is installed; with the `torch` extra, pinned to the CPU build of
#      scripts/constraints-torch.txt) and Debian's pyverbs importable
#   5. the native data plane and the host passes, built in place (make -C switch/native all io;
#      make -C netreduce/native)
# Usage: scripts/install.sh [--no-kernel] [--no-venv] [--no-p4] [--p4 PREFIX|DIR|ARCHIVE]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MIN_KERNEL=7.1
APT_DIR=${NR_APT_DIR:-/var/cache/netreduce-apt}
VENV=${NR_VENV:-$ROOT/.venv}
P4_FROM=${NR_P4_TOOLCHAIN:-}
P4_PREFIX=${NR_P4_PREFIX:-/opt/p4}
BIN_DIR=${NR_BIN_DIR:-/usr/local/bin}
want_kernel=1 want_venv=1 want_p4=1
while [ $# -gt 0 ]; do
  case $1 in
    --no-kernel) want_kernel=0 ;;
    --no-venv) want_venv=0 ;;
    --no-p4) want_p4=0 ;;
    --p4) [ $# -ge 2 ] || { echo "install.sh: --p4 needs a prefix, directory or archive" >&2; exit 2; }
          P4_FROM=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

step() { printf '\n==> [install] %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "install.sh: must run as root (apt-get, /lib/modules)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive

DEB_PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils
          python3-pyverbs python3-venv perftest iproute2 ethtool kmod iputils-ping tcpdump
          procps openssl
          gcc make clang llvm libisal-dev libxdp-dev libbpf-dev xdp-tools valgrind)
          # the second line: the native data plane (switch/native) and BMv2's loopback shim
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

# --- p4c and BMv2 (optional) ---------------------------------------------------------------
P4_TOOLS=(p4c p4c-bm2-ss simple_switch simple_switch_grpc simple_switch_CLI)
p4_runs() {  # PREFIX: its p4c and simple_switch_grpc are there and run
  [ -x "$1/bin/p4c" ] && "$1/bin/p4c-bm2-ss" --version >/dev/null 2>&1 \
    && "$1/bin/simple_switch_grpc" --version >/dev/null 2>&1
}
p4_prefix=""
if [ $want_p4 = 1 ]; then
  if [ -z "$P4_FROM" ] && p4_runs "$P4_PREFIX"; then
    :                                                                   # present
  elif [ -z "$P4_FROM" ] && [ -x "$ROOT/../shared/p4-toolchain/install.sh" ]; then
    step "p4c + BMv2: installing $ROOT/../shared/p4-toolchain into $P4_PREFIX"
    "$ROOT/../shared/p4-toolchain/install.sh" "$P4_PREFIX"
  elif [ -n "$P4_FROM" ] && [ -x "$P4_FROM/install.sh" ]; then          # a toolchain directory
    step "p4c + BMv2: installing $P4_FROM into $P4_PREFIX"
    "$P4_FROM/install.sh" "$P4_PREFIX"
  elif [ -n "$P4_FROM" ] && [ -d "$P4_FROM" ]; then                     # an installed prefix
    P4_PREFIX=$(cd "$P4_FROM" && pwd)
    step "p4c + BMv2: using the prefix $P4_PREFIX"
  elif [ -n "$P4_FROM" ] && [ -f "$P4_FROM" ]; then                     # an archive of a prefix
    if [ "$(cat "$P4_PREFIX/.p4-archive.sha256" 2>/dev/null)" = "$(sha256sum "$P4_FROM" | cut -d' ' -f1)" ]; then
      step "p4c + BMv2: $P4_FROM already unpacked in $P4_PREFIX"
    else
      step "p4c + BMv2: unpacking $P4_FROM into $P4_PREFIX"
      mkdir -p "$P4_PREFIX"
      tar -C "$P4_PREFIX" -xf "$P4_FROM"
      sha256sum "$P4_FROM" | cut -d' ' -f1 > "$P4_PREFIX/.p4-archive.sha256"
    fi
    if [ -d "$P4_PREFIX/lib" ]; then echo "$P4_PREFIX/lib" > /etc/ld.so.conf.d/netreduce-p4.conf; ldconfig; fi
  elif [ -n "$P4_FROM" ]; then
    echo "install.sh: --p4 / NR_P4_TOOLCHAIN: $P4_FROM is no prefix, toolchain directory or archive" >&2
    exit 1
  fi
  if p4_runs "$P4_PREFIX"; then
    p4_prefix=$P4_PREFIX
    mkdir -p "$BIN_DIR"
    for t in "${P4_TOOLS[@]}"; do
      [ -x "$P4_PREFIX/bin/$t" ] && ln -sfn "$P4_PREFIX/bin/$t" "$BIN_DIR/$t"
    done
    step "p4c + BMv2 in $P4_PREFIX: $("$BIN_DIR/p4c" --version 2>&1 | head -1), BMv2 $("$BIN_DIR/simple_switch_grpc" --version 2>&1 | head -1); linked into $BIN_DIR"
  elif [ -n "$P4_FROM" ] || [ -d "$P4_PREFIX/bin" ]; then
    echo "install.sh: p4c/BMv2 in $P4_PREFIX do not run (p4c-bm2-ss/simple_switch_grpc --version failed: runtime libraries missing?)" >&2
    exit 1
  else
    step "p4c + BMv2: not installed (optional; the BMv2 target needs them): install p4lang's p4c and behavioral-model (their packages or a source build, with P4Runtime), then scripts/install.sh --p4 PREFIX"
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
  extras=dev,torch check='import pyverbs.device, numpy, ml_dtypes, scapy, grpc, virtme_ng, torch'
  if [ -n "$p4_prefix" ] || { [ $want_p4 = 0 ] && command -v simple_switch_grpc >/dev/null; }; then
    extras=$extras,bmv2 check="$check, p4runtime_sh.shell"   # BMv2 is driven over P4Runtime
  fi
  step "venv: installing the project (pip install -e '.[$extras]', torch pinned by scripts/constraints-torch.txt)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -c "$ROOT/scripts/constraints-torch.txt" -e "$ROOT[$extras]"
  "$VENV/bin/python" -c "$check" || { echo "install.sh: venv is incomplete" >&2; exit 1; }
  step "venv: ready ($VENV/bin/python)"
fi
# --- the native data plane (switch/native: libnrdp.so, the pipeline; libnrio.so, AF_XDP I/O) --
step "native data plane: make -C switch/native all io"
make -s -C "$ROOT/switch/native" all io
step "host passes: make -C netreduce/native"
make -s -C "$ROOT/netreduce/native"
step "done"
