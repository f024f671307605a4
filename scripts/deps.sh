#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build and test. Idempotent:
# installs only what is missing, so re-running it is cheap and safe.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libjansson-dev libpcre2-dev libutf8proc-dev libopenblas-dev libcmocka-dev libevent-dev
      nodejs npm perl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# nodejs/npm may come from elsewhere (e.g. NodeSource); a working binary is enough.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=($(printf '%s\n' "${missing[@]}" | grep -vx -e nodejs -e npm || true))
fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "deps: ok"
