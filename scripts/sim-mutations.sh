#!/usr/bin/env bash
# Breaks the engine on purpose, once per invariant, and checks that the
# simulation (tests/sim/engine.rs) catches each break and names the
# invariant. Not part of the test command: every mutation rebuilds the
# library (about 2 minutes each on 2 cores). Each file is restored after
# its run, also when the script is interrupted.
#
#   scripts/sim-mutations.sh            every mutation, 2,000 seeds each
#   SIM_SEEDS=500 scripts/sim-mutations.sh 4 6   mutations 4 and 6 only
#
# Prints one line per mutation: the invariant it breaks, whether the
# simulation caught it, and the first line it reported.
set -euo pipefail
cd "$(dirname "$0")/.."
export SIM_SEEDS=${SIM_SEEDS:-2000}

# invariant, file, perl substitution (-0 mode), what it breaks: tab-separated
MUTATIONS=(
  $'1\tsrc/worker/seller.rs\ts/for \\(k, origin\\) in asked\\.iter\\(\\)\\.take\\(g\\.jobs\\)\\.enumerate\\(\\)/for (k, origin) in asked.iter().enumerate()/; s/if units \\+ cost > g\\.units \\{\\s*break;\\s*\\}//\ta grant of k jobs calls every job asked about'
  $'2\tsrc/worker/scheduler.rs\ts/for p in unused\\.into_iter\\(\\)\\.rev\\(\\) \\{/for p in unused.into_iter().rev().filter(|_| false) {/\tjobs a run did not call (after a 429) are dropped'
  $'3\tsrc/worker/engine/call.rs\ts/Answer::Unreachable \\{ \\.\\. \\} if self\\.outage\\.is_open\\(\\)/Answer::Unreachable { .. } if false/; s/if reached_nothing\\s*&& previous/if false \&\& previous/\ta downstream outage spends the jobs\' attempts'
  $'4\tsrc/worker/scheduler.rs\ts/if !seller\\.wants_paced_slot \\{\\s*seller\\.wants_paced_slot = true;\\s*self\\.paced_waiters\\.push_back\\(key\\.clone\\(\\)\\);\\s*\\}/due.next_at = Some(after(now, Duration::from_millis(50)));/\ta due paced job that finds every slot taken looks again 50 ms later instead of taking the next freed slot'
  $'5\tsrc/worker/engine/call.rs\ts/RetryAfter::Wait\\(wait\\) if !wait\\.is_zero\\(\\) => wait,/RetryAfter::Wait(wait) => wait,\\n                _ if true => Duration::ZERO,/\ta 429 with no useful wait holds the seller for nothing'
  $'6\tsrc/worker/engine/call.rs\ts/(        let at = after\\(now, wait\\);)/        self.deps.source.finish(&p.origin);\\n$1/\ta failed job is marked finished before it is'
  $'8\tsrc/worker/engine/call.rs\ts/!stopped\(\) && !paused\(\) &&/!stopped() \&\&/; s/if self\.pause_of\(key\)\.is_some\(\) \{/if false {/\tgranted work (a run under way, a pacer\'s due jobs) is called after a pause began'
  $'1\tlua/common.lua\ts/(local function lost_fill\\(r, G, now\\)\\n)/$1  do return nil end\\n/\tRedis losing its data: the lost state read as fresh (what redis.on_state_loss = admit does; the simulation runs the Lua, so the Lua is broken, not its Rust model)'
  $'10\tsrc/worker/scheduler.rs\ts/if head\.go_at > now \{/if false \&\& head.go_at > now {/\ta paced job goes the moment it is granted, not at its go-at (issue 33: it passed every seed while invariant 1 trusted X-Granted-At)'
  $'11\tsrc/kafka/offsets.rs\ts/Some\(done\) if self\.open\.is_empty\(\) => Some\(self\.past_inherited\(done \+ 1\)\)/Some(done) if self.open.is_empty() => Some(self.past_inherited(done))/\ta partition whose every record is finished commits one short of its end (a lag of 1 that never drains)'
  $'11\tsrc/worker/slots.rs\ts/(    while let Some\\(first\\) = queued\\.recv\\(\\)\\.await \\{\\n)/$1        if first.1.len() < usize::MAX { continue; }\\n/\tslots of max_in_flight are never given back (each lapses with its lease)'
  $'12\tsrc/kafka/session.rs\ts/if t\\.offsets\\.inherited_done\\(topic, partition, offset\\) \\{/if false \\&\\& t.offsets.inherited_done(topic, partition, offset) {/\ta new owner does again what its partition\'s last owner finished (the commit\'s metadata and the handoff ledger ignored)'
  $'15\tsrc/worker/seller.rs\ts/self\\.out\\.contains\\(&p\\.lane\\)\\s*\\|\\|/false ||/; s/debug_assert!\\(!self\\.out\\.contains\\(&lane\\), "two jobs of \\{lane:\\?\\} out"\\);//\ta lane with a job out is asked about again (two jobs of one ordering key at the downstream together; issue 50)'
  $'16\tsrc/worker/handoff.rs\ts/\\.partition\\(\\|w\\| w\\.parts\\.iter\\(\\)\\.all\\(\\|tp\\| !under_way\\.contains_key\\(tp\\)\\)\\)/.partition(|_| true)/\ta revoke goes on at once, without waiting for the calls under way on its partitions (issue 53: their successes are done again by the next owner)'
  $'17\tsrc/worker/answers.rs\ts/Answer::Unavailable \\{ retry_after, \\.\\. \\} => Health::Down \\{\\s*retry_after: \\*retry_after,\\s*\\},/Answer::Unavailable { .. } => Health::Failed { job_id },/\ta 503 with Retry-After (a planned maintenance) read as one failed call: the downstream is called again within the wait it named (issue 53)'
  $'16\tsrc/worker/answers.rs\ts/(        Answer::Done => Action::Done,)/        Answer::Done if tries.last_failed_at.is_some() => {\\n            return failed(tries, false, seen, policy, now, rng, "checked again".to_owned())\\n        }\\n$1/\ta success after a failed call (a timeout that may have registered) is called once more to make sure: a success the client saw, done again (issue 53: the gave-up excuse of invariant 16 must not hide it)'
  $'1\tsrc/limiter/policy.rs\ts/            seller: own,\\n/            seller: \\&own[..1],\\n/\ta seller held to several rules is checked against its first only (issue 53)'
  $'1\tsrc/limiter/policy.rs\ts/            global: \\&self\\.global,\\n/            global: \\&[],\\n/\tthe global rules are never checked (issue 53)'
  $'1\tlua/sliding_window_counter.lua\ts/      prev = num\\(vcur, 0\\)\\n/      prev = 0\\n/\ta sliding_window_counter forgets the window before: a fixed window, twice the limit across a boundary (issue 53)'
  $'1\tlua/burst_fill.lua\ts/now >= s \\+ r\\.period then/now >= s + r.period \\/ 4 then/\ta burst_fill refilled four times a period (issue 53)'
  $'1\tsrc/worker/admission.rs\ts/\\.acquire_jobs\\(key, asked\\.rules, &costs, asked\\.share\\)/.acquire_jobs(key, None, \\&costs, asked.share)/\tredis.on_error = local admits everything while Redis fails (its in-memory limits handed no rules; issue 53)'
  $'9\tsrc/worker/admission.rs\ts/let room = mine\\.saturating_sub\\(asked\\.busy\\);/let room = mine;/\tadmitting without Redis (local, fail_open) forgets the seller\'s calls under way: a capped seller goes over its max_in_flight (issue 53)'
  $'1\tlua/restore.lua\ts/      out\[i\] = restore_part\(r, now, lost, after, ARGV\[6 \+ nrules \* 5 \+ i\] or \'\'\)/      out[i] = 0/\tthe merge after a loss writes back nothing of a replica\'s part: each seller goes on from an empty state once the bounded hold ends (issue 52, item 5)'
  $'1\tlua/common.lua\ts/(local function server_moved\\(G, now\\)\\n)/$1  do return nil end\\n/\ta failover (every key back to an older copy, under another server) goes unseen: a replica that lost nothing grants from the older state, and a capped seller\'s lost leases free its slots (issue 52, item 3)'
  $'18\tsrc/kafka/session.rs\ts/Err\\(_\\) if t\\.offsets\\.received\\(topic, partition, offset\\) => \\{/Err(_) if false \\&\\& t.offsets.received(topic, partition, offset) => {/\ta record the broker delivers again within its assignment (a fetch retried) is taken as work again, held or finished here (issue 53, item 4)'
  $'19\tsrc/worker/engine/write.rs\ts/self\\.spawn_write\\(pending, Duration::from_secs\\(1\\)\\);/self.spawn_write(pending, Duration::ZERO);/\ta failed write to a retry tier or the dead-letter topic is tried again at once: a produce outage spins (issue 53, item 4)'
  $'2\tsrc/worker/engine/write.rs\ts/Err\\(error\\) => self\\.retry_write\\(pending, &error\\.to_string\\(\\)\\),/Err(_) => {\\n                self.deps.source.finish(\\&pending.origin);\\n                self.memory.remove(pending.bytes);\\n            }/\ta write to a retry tier or the dead-letter topic the broker never acknowledged counts as made: the record finished, its job lost (issue 53, item 4)'
  $'20\tsrc/kafka/fence.rs\ts/if gap <= watch\\.stall_after \\{/if true {/\ta replica stalled past its session timeout does not see the gap when it resumes: it calls jobs of the partitions the group gave to the others, with its lapsed leases, until librdkafka says its assignment is lost (issue 53, item 2)'
  $'12\tsrc/kafka/session.rs\ts/(\\.offsets\\s*)\\.committable\\(\\)(\\s*\\.into_iter\\(\\)\\s*\\.filter\\(\\|c\\| \\{\\s*revoked)/$1.uncommitted()$2/\ta revoke commits only the partitions whose offset moved since its last accepted commit: a commit the broker lost is not made again, and the next owner redoes what the loss dropped (issue 53, item 4)'
  $'3\tsrc/limiter/policy.rs\ts/        if rc\\.shadow \\{/        if false \\&\\& rc.shadow {/\ta shadow rule holds calls as an enforced one does (issue 53, item 4: a job above its capacity is dead-lettered as if its own fault)'
  $'1\tsrc/limiter/policy.rs\ts/SellerLimits::Rules\\(r\\.enforced\\.clone\\(\\)\\),/SellerLimits::Rules(default.enforced.clone()),/\ta seller under a tier is held to the default rules, not its tier\'s (issue 53, item 4)'
  $'1\tsrc/limiter/core.rs\ts/        base\\.0 = Arc::new\\(policy\\);\\n        self\\.apply\\(&base\\);/        base.0 = Arc::new(policy);/\ta live edit of [limits] is never put in force (the swap waits for an override to change): calls after it keep the old limits (issue 53, item 4)'
  $'7\tsrc/worker/timers.rs\ts/Duration::from_millis\\(unix_ms_at\\.saturating_sub\\(now_ms\\)\\)/Duration::from_millis(unix_ms_at - now_ms)/\ta wait until a due time on the fleet\'s clock read as an unsigned difference (a due time already passed wraps; the host-clock version, until_unix_ms, now only times pauses, which no random world steps back)'
)

only=("$@")
restore=""
cleanup() { [ -n "$restore" ] && git checkout -q -- "$restore"; restore=""; }
trap cleanup EXIT INT TERM

for m in "${MUTATIONS[@]}"; do
  IFS=$'\t' read -r inv file subst what <<<"$m"
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " =~ " $inv " ]]; then continue; fi
  if ! git diff --quiet -- "$file"; then
    echo "invariant $inv: $file has uncommitted changes; commit or stash them first" >&2
    exit 2
  fi
  restore="$file"
  perl -0pi -e "$subst" "$file"
  if git diff --quiet -- "$file"; then
    echo "invariant $inv: the mutation no longer applies to $file (the code moved); update it" >&2
    exit 2
  fi
  printf '=== invariant %s: %s (%s, %s seeds)\n' "$inv" "$what" "$file" "$SIM_SEEDS"
  started=$(date +%s)
  out=$(cargo test --test sim sim::engine:: 2>&1 || true)
  cleanup
  found=$(grep -E "^ *${inv}\. " <<<"$out" | head -1 || true)
  seeds=$(grep -cE '^seed [0-9]+: replay' <<<"$out" || true)
  if [ -n "$found" ]; then
    printf 'caught (%s seeds broke it, %ss): %s\n' "$seeds" "$(( $(date +%s) - started ))" "$(sed -E 's/^ +//' <<<"$found" | cut -c1-160)"
    # How many seeds of each run failed, and the lowest one reported (of
    # its first ten): about how many seeds the break needs to be caught.
    grep -E '^(fleet )?simulation: [0-9]+ seeds from .* failed$' <<<"$out" | sed -E 's/ in [0-9.]+ s \(.*\),/,/' || true
    for v in SIM_SEED SIM_FLEET_SEED; do
      low=$(grep -oE "^seed [0-9]+: replay with .${v}=" <<<"$out" | grep -oE '[0-9]+' | sort -n | head -1 || true)
      if [ -n "$low" ]; then printf '  lowest failing seed reported (%s): %s\n' "$v" "$low"; fi
    done
  else
    printf 'NOT CAUGHT: no report of invariant %s\n' "$inv"
    grep -E "^ *[0-9]\. |panicked|error" <<<"$out" | head -5 || true
  fi
done
