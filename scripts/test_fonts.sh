#!/usr/bin/env bash
# The format tests draw scanned pages of Chinese text, which needs a CJK font: WenQuanYi Micro Hei
# (Debian's fonts-wqy-microhei, 5 MB). Installed with apt-get when missing, as services.sh installs Redis.
set -euo pipefail

FONT=/usr/share/fonts/truetype/wqy/wqy-microhei.ttc
[[ -f $FONT ]] && exit 0
echo "test_fonts.sh: $FONT not found; installing fonts-wqy-microhei with apt-get (needs root) ..." >&2
((EUID == 0)) || { echo "test_fonts.sh: not root; install it: apt-get install fonts-wqy-microhei" >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || { echo "test_fonts.sh: apt-get is unavailable; install a CJK font at $FONT" >&2; exit 1; }
log=$(mktemp)
if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 fonts-wqy-microhei ||
       { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 fonts-wqy-microhei; }; } \
       >"$log" 2>&1 </dev/null; then
    tail -n 20 "$log" >&2
    echo "test_fonts.sh: apt-get install fonts-wqy-microhei failed; log: $log" >&2
    exit 1
fi
rm -f "$log"
[[ -f $FONT ]] || { echo "test_fonts.sh: $FONT still missing after installing" >&2; exit 1; }
