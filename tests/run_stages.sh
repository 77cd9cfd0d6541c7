#!/usr/bin/env bash
# make test's stages, in order: "a+b" runs stages a and b side by side (they share
# nothing: the library's tests and the judge's, say), each into a log of its own that
# is printed whole once all are done. "bg:a" starts stage a in the background, beside
# every later step (the browser's visits, which wait on pages much of their time and
# use about one core): its log is printed, and its status counted, at the end.
# "bg:a,b" runs a then b in the background (b only if a passed): the site's build
# (one core) and then the browser's visits of it.
# Stops at the first step that fails, or after the step during which a background
# stage failed (a background stage still running is stopped then); prints how long
# each stage took (one that ran beside others: from the step's start to its end).
#   usage: tests/run_stages.sh lint bg:test-book,test-browser test-unit+test-practice ...
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

run_chain() {  # run stages $1, $2... in order, each logged; after a failure, none
  failed=""
  for part in "$@"; do
    if [ -n "$failed" ]; then  # not run: recorded as failed, after the one that did
      echo "not run: $failed failed" > "$logs/$part.log"
      date +%s > "$logs/$part.end"
      echo 1 > "$logs/$part.rc"
      continue
    fi
    run_logged "$part"
    [ "$(cat "$logs/$part.rc")" = 0 ] || failed=$part
  done
}

stop_failed() {  # step $1 failed with status $2: the times so far, and stop
  printf "\nmake test: %s failed. Stage times:\n$times" "$1"
  exit "$2"
}

report_background_failure() {  # a background stage that failed: its log, and stop
  for part in "${background[@]}"; do
    if [ -f "$logs/$part.rc" ] && [ "$(cat "$logs/$part.rc")" != 0 ]; then
      print_logged "$part" "$(started "$part")"
      stop_failed "$part" "$(cat "$logs/$part.rc")"
    fi
  done
}

started() {  # when background stage $1 started: the chain's start, or the end before
  if [ -f "$logs/$1.after" ]; then cat "$logs/$(cat "$logs/$1.after").end"
  else cat "$logs/$1.start"; fi
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
    IFS=, read -ra chain <<< "${step:3}"
    echo "make test: ${chain[*]} run in the background, in that order, beside the stages after them (their logs follow at the end)"
    setsid bash -c "$(declare -f run_logged run_chain); make='$make' logs='$logs'; run_chain ${chain[*]}" &
    for part in "${chain[@]}"; do
      echo $! > "$logs/$part.pid"  # the chain's process group
      background+=("$part")
    done
    echo "$start" > "$logs/${chain[0]}.start"
    for ((i = 1; i < ${#chain[@]}; i++)); do  # a stage's time starts when the one before ends
      echo "${chain[i-1]}" > "$logs/${chain[i]}.after"
    done
    continue
  fi
  IFS=+ read -ra parts <<< "$step"
  if [ "${#parts[@]}" = 1 ]; then
    $make --no-print-directory "$step" || status=$?
    times+=$(printf '  %-15s %5d s' "$step" $(($(date +%s) - start)))"\n"
  else
    pids=()
    for part in "${parts[@]}"; do
      others=()
      for other in "${parts[@]}"; do [ "$other" = "$part" ] || others+=("$other"); done
      echo "make test: $part runs beside $(printf '%s and ' "${others[@]}" | sed 's/ and $//') (its log follows when they end)"
      run_logged "$part" &
      pids+=($!)
    done
    wait "${pids[@]}"  # these, not a background stage
    for part in "${parts[@]}"; do
      print_logged "$part" "$start"
      [ "$(cat "$logs/$part.rc")" = 0 ] || status=$(cat "$logs/$part.rc")
    done
  fi
  [ "$status" = 0 ] || stop_failed "$step" "$status"
  report_background_failure
done
for part in "${background[@]}"; do
  while [ ! -f "$logs/$part.rc" ]; do sleep 1; done
  print_logged "$part" "$(started "$part")"
  [ "$(cat "$logs/$part.rc")" = 0 ] || stop_failed "$part" "$(cat "$logs/$part.rc")"
done
printf "\nmake test passed. Stage times:\n$times  %-15s %5d s\n" total $(($(date +%s) - total))
