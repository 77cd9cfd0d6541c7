#!/usr/bin/env bash
# make test's stages, in order: "a+b" runs stages a and b side by side (they share
# nothing: the library's tests and the judge's, say), each into a log of its own that
# is printed whole once all are done. "bg:a" starts stage a in the background, beside
# every later step (the browser's visits, which wait on pages much of their time and
# use about one core): its log is printed, and its status counted, at the end.
# Stops at the first step that fails (a background stage still running is stopped
# then); prints how long each stage took (one that ran beside others: from the
# step's start to its end).
#   usage: tests/run_stages.sh lint bg:test-browser test-unit+test-practice ...
set -u
make=${MAKE:-make}
logs=$(mktemp -d)
background=()
stop_background() {
  for part in "${background[@]}"; do
    [ -f "$logs/$part.rc" ] && continue  # it ended
    pid=$(cat "$logs/$part.pid")
    # The stage leads a process group of its own (setsid): interrupt all of it, as
    # Ctrl-C would (pytest then runs its fixtures' clean-up), then kill what is left.
    kill -INT -- "-$pid" 2>/dev/null
    for _ in $(seq 60); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null
  done
}
trap 'stop_background; rm -rf "$logs"' EXIT
times=""
total=$(date +%s)

run_logged() {  # run stage $1 into its log; record status and end time
  $make --no-print-directory "$1" > "$logs/$1.log" 2>&1
  echo $? > "$logs/$1.rc"
  date +%s > "$logs/$1.end"
}

print_logged() {  # print stage $1's log; add its time since $2 to the times
  printf '\n----- %s -----\n' "$1"
  cat "$logs/$1.log"
  times+=$(printf '  %-15s %5d s' "$1" $(($(cat "$logs/$1.end") - $2)))"\n"
}

for step in "$@"; do
  start=$(date +%s)
  status=0
  if [ "${step:0:3}" = "bg:" ]; then
    part=${step:3}
    echo "make test: $part runs in the background, beside the stages after it (its log follows at the end)"
    setsid bash -c "$(declare -f run_logged); make='$make' logs='$logs'; run_logged $part" &
    echo $! > "$logs/$part.pid"
    echo "$start" > "$logs/$part.start"
    background+=("$part")
    continue
  fi
  IFS=+ read -ra parts <<< "$step"
  if [ "${#parts[@]}" = 1 ]; then
    $make --no-print-directory "$step" || status=$?
    times+=$(printf '  %-15s %5d s' "$step" $(($(date +%s) - start)))"\n"
  else
    pids=()
    for part in "${parts[@]}"; do
      echo "make test: $part runs beside ${step//+/ and } (its log follows when they end)"
      run_logged "$part" &
      pids+=($!)
    done
    wait "${pids[@]}"  # these, not a background stage
    for part in "${parts[@]}"; do
      print_logged "$part" "$start"
      [ "$(cat "$logs/$part.rc")" = 0 ] || status=$(cat "$logs/$part.rc")
    done
  fi
  if [ "$status" != 0 ]; then
    printf "\nmake test: %s failed. Stage times:\n$times" "$step"
    exit "$status"
  fi
done
for part in "${background[@]}"; do
  while [ ! -f "$logs/$part.rc" ]; do sleep 1; done
  print_logged "$part" "$(cat "$logs/$part.start")"
  if [ "$(cat "$logs/$part.rc")" != 0 ]; then
    printf "\nmake test: %s failed. Stage times:\n$times" "$part"
    exit "$(cat "$logs/$part.rc")"
  fi
done
printf "\nmake test passed. Stage times:\n$times  %-15s %5d s\n" total $(($(date +%s) - total))
