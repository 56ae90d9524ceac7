#!/usr/bin/env bash
# Makes sure Debian's headless Chromium is installed for the admin page's browser tests
# (Playwright drives it through executable_path: its own browser download is not used).
# fonts-noto-cjk and fonts-noto-color-emoji: the pages show Chinese questions and 👍/👎; without
# them the screenshots show empty boxes. Prints the executable's path on stdout; messages go to stderr.
set -euo pipefail

PACKAGES=(chromium fonts-noto-cjk fonts-noto-color-emoji)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "browser.sh: installing ${missing[*]} with apt-get (needs root) ..." >&2
    ((EUID == 0)) || { echo "browser.sh: not root; install them: apt-get install ${missing[*]}" >&2; exit 1; }
    command -v apt-get >/dev/null 2>&1 || { echo "browser.sh: apt-get is unavailable; install ${missing[*]}" >&2; exit 1; }
    log="$(mktemp)"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
           DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}"; } >"$log" 2>&1; then
        echo "browser.sh: apt-get install ${missing[*]} failed; log: $log" >&2
        exit 1
    fi
    rm -f "$log"
fi
command -v chromium || { echo "browser.sh: chromium is installed but not on PATH" >&2; exit 1; }
