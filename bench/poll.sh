#!/usr/bin/env bash
# poll.sh LOG [MAX_S]: print LOG as it grows until it says ALL_DONE or MAX_S (default 540) pass; where $OUT is set
# (a device call), LOG is copied there as it grows, so a call cut short by its time still brings the log back. In a
# device call, after starting a bench/device-*.sh script in the background, e.g.
#   setsid nohup bash bench/device-round.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/round/main.log 570
# (do not pipe poll.sh into a filter: a call cut short then returns nothing the filter held back).
log=$1; max=${2:-540}; t=0; n=0
while [ $t -lt $max ]; do
  if [ -f "$log" ]; then
    l=$(wc -l < "$log"); if [ "$l" -gt "$n" ]; then sed -n "$((n+1)),${l}p" "$log"; n=$l
      [ -n "${OUT:-}" ] && cp "$log" "$OUT/" 2>/dev/null; fi
    grep -q ALL_DONE "$log" && exit 0
  fi
  sleep 3; t=$((t+3))
done
echo "(poll: still running after ${max}s)"
