//! [`Coalescer`]: many sellers' job lists in one limiter call.
//!
//! A busy, unthrottled fleet asks the limiter once per seller with one job
//! waiting: one script call per job, and Redis spends most of each call on
//! what every call pays (the command, the clock, reading the arguments)
//! rather than on the decision. The coalescer queues the asks that arrive
//! together and sends them as one [`Limiter::check_jobs_many`] call, one
//! decision per seller, decided in order inside one script.
//!
//! A call takes what is queued when it starts, or waits up to `window` (at
//! most a millisecond) for more. Asks sent together as one group
//! ([`Coalescer::acquire_jobs_many`]: the worker's asks of one turn of its
//! loop) go in one call, up to `max`, whatever the timing of the tasks: on
//! a multi-threaded runtime the coalescer could otherwise take the first of
//! them before the others were queued. While
//! `in_flight` calls are out, new asks queue behind them, so the batches grow
//! with the load by themselves: under light load a call carries one ask and
//! adds no wait; under heavy load it carries up to `max` asks. With
//! `redis.topology = cluster` the sellers' keys lie in different slots, so a
//! batch goes out as concurrent calls, one per seller, and each ask is
//! answered when its own call is: one seller's failed or slow call is that
//! seller's alone.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use std::future::Future;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::core::JobsQuery;
use super::core::{Limiter, LimiterError};
use super::decision::BatchDecision;
use super::jobs::granted_units;
use super::store::Store;
use crate::config::Topology;
use crate::telemetry::events::LimiterCallCoalesced;

/// What a coalesced ask can fail with: the error of the call that carried
/// it (shared by every ask of that call), or a coalescer that has stopped.
#[derive(Debug, thiserror::Error)]
pub enum CoalesceError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Limiter(Arc<LimiterError<E>>),
    #[error("the limiter's coalescer has stopped")]
    Stopped,
}

/// tokio's timers fire on whole-millisecond ticks: a shorter wait through
/// one lasts until the next tick, up to a millisecond too long.
const TIMER_GRAIN: Duration = Duration::from_millis(1);

/// How asks are grouped into calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceSettings {
    /// Most asks in one call; 1 sends every ask on its own.
    pub max: usize,
    /// How long a call waits for more asks after the first; zero takes
    /// only what is already queued.
    pub window: Duration,
    /// Calls out at once.
    pub in_flight: usize,
}

impl Default for CoalesceSettings {
    fn default() -> Self {
        CoalesceSettings {
            max: 128,
            window: Duration::ZERO,
            in_flight: 4,
        }
    }
}

type Answer<E> = Result<BatchDecision, CoalesceError<E>>;

struct Ask<E: std::error::Error + 'static> {
    seller: String,
    costs: Vec<u64>,
    reply: oneshot::Sender<Answer<E>>,
}

/// A [`Limiter`] whose job-list asks are coalesced; cheap to clone. The
/// background task stops when the last clone is dropped.
pub struct Coalescer<S: Store> {
    limiter: Arc<Limiter<S>>,
    tx: mpsc::UnboundedSender<Vec<Ask<S::Error>>>,
}

impl<S: Store> Clone for Coalescer<S> {
    fn clone(&self) -> Self {
        Coalescer {
            limiter: self.limiter.clone(),
            tx: self.tx.clone(),
        }
    }
}

impl<S: Store + 'static> Coalescer<S> {
    /// Starts the coalescing task on the current tokio runtime.
    pub fn start(limiter: Arc<Limiter<S>>, settings: CoalesceSettings) -> Coalescer<S> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(limiter.clone(), rx, settings));
        Coalescer { limiter, tx }
    }

    /// The limiter behind it, for everything but job lists.
    pub fn limiter(&self) -> &Arc<Limiter<S>> {
        &self.limiter
    }

    /// [`Limiter::acquire_jobs`], carried in a call with whatever other
    /// asks arrive with it.
    pub async fn acquire_jobs(
        &self,
        seller: &str,
        costs: &[u64],
    ) -> Result<BatchDecision, CoalesceError<S::Error>> {
        if let Some(e) = check_costs(costs) {
            return Err(CoalesceError::Limiter(Arc::new(e)));
        }
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            seller: seller.to_owned(),
            costs: costs.to_vec(),
            reply,
        };
        self.tx
            .send(vec![ask])
            .map_err(|_| CoalesceError::Stopped)?;
        answer.await.unwrap_or(Err(CoalesceError::Stopped))
    }

    /// [`Coalescer::acquire_jobs`] for several sellers at once: the asks
    /// go as one group, now, in one call (in calls of `max` when there
    /// are more), with whatever else is queued. Each answer comes with its
    /// ask's index as soon as its call answers (in cluster topology, each
    /// seller's call is its own).
    pub fn acquire_jobs_many(
        &self,
        asks: &[(Arc<str>, Vec<u64>)],
    ) -> FuturesUnordered<impl Future<Output = (usize, Answer<S::Error>)> + Send + 'static> {
        let mut group = Vec::with_capacity(asks.len());
        let answers = FuturesUnordered::new();
        for (i, (seller, costs)) in asks.iter().enumerate() {
            let (reply, answer) = oneshot::channel();
            match check_costs(costs) {
                Some(e) => {
                    let _ = reply.send(Err(CoalesceError::Limiter(Arc::new(e))));
                }
                None => group.push(Ask {
                    seller: seller.to_string(),
                    costs: costs.clone(),
                    reply,
                }),
            }
            answers.push(async move { (i, answer.await.unwrap_or(Err(CoalesceError::Stopped))) });
        }
        // A send fails only once the task stopped: every answer then says
        // so (its reply was dropped).
        if !group.is_empty() {
            let _ = self.tx.send(group);
        }
        answers
    }
}

/// Why an ask cannot be sent: checked before it joins a call, so that one
/// bad ask cannot fail the others'.
fn check_costs<E: std::error::Error + 'static>(costs: &[u64]) -> Option<LimiterError<E>> {
    if costs.is_empty() {
        Some(LimiterError::NoJobs)
    } else if costs.contains(&0) {
        Some(LimiterError::ZeroCost)
    } else {
        None
    }
}

async fn run<S: Store + 'static>(
    limiter: Arc<Limiter<S>>,
    mut rx: mpsc::UnboundedReceiver<Vec<Ask<S::Error>>>,
    settings: CoalesceSettings,
) {
    let max = settings.max.max(1);
    let slots = Arc::new(Semaphore::new(settings.in_flight.max(1)));
    // Asks received but not yet sent: the rest of a group larger than what
    // one call could carry goes first in the next call.
    let mut queued: VecDeque<Ask<S::Error>> = VecDeque::new();
    loop {
        // A call slot first: while every slot is taken, asks pile up in
        // the channel and the next batch takes them all.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        if queued.is_empty() {
            let Some(group) = rx.recv().await else {
                return;
            };
            queued.extend(group);
            // Let the tasks woken with the first one queue their asks too.
            tokio::task::yield_now().await;
        }
        while queued.len() < max {
            match rx.try_recv() {
                Ok(group) => queued.extend(group),
                Err(_) => break,
            }
        }
        if settings.window >= TIMER_GRAIN {
            let deadline = tokio::time::Instant::now() + settings.window;
            while queued.len() < max {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(group)) => queued.extend(group),
                    _ => break,
                }
            }
        } else if !settings.window.is_zero() {
            // A timer would hold the call until the next millisecond tick,
            // whatever the window: below the grain, poll between the other
            // tasks' turns instead (CPU while the window lasts, and only
            // when a window is configured). std's clock, as tokio's stands
            // still under a paused test clock while tasks keep running.
            let deadline = std::time::Instant::now() + settings.window;
            while queued.len() < max && std::time::Instant::now() < deadline {
                match rx.try_recv() {
                    Ok(group) => queued.extend(group),
                    Err(mpsc::error::TryRecvError::Empty) => tokio::task::yield_now().await,
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                }
            }
        }
        let batch: Vec<Ask<S::Error>> = queued.drain(..queued.len().min(max)).collect();
        let limiter = limiter.clone();
        tokio::spawn(async move {
            decide(&limiter, batch, slot).await;
        });
    }
}

/// One call for the whole batch (one per seller in cluster topology);
/// every ask gets its own decision, or the error of the call that carried
/// it. Only then are the granted sellers' shadow rules asked, with the
/// call slot given back: a slow shadow rule holds back neither a grant nor
/// the next batch.
async fn decide<S: Store>(
    limiter: &Limiter<S>,
    batch: Vec<Ask<S::Error>>,
    slot: OwnedSemaphorePermit,
) {
    LimiterCallCoalesced { asks: batch.len() }.emit();
    if limiter.topology == Topology::Cluster {
        // One call per seller (their keys lie in different slots): each
        // ask is answered as soon as its own call is, so a seller whose
        // master hangs holds back no other seller's answer.
        let calls = batch.into_iter().map(|ask| async move {
            let answer = limiter
                .check_jobs_enforced(JobsQuery::new(&ask.seller, &ask.costs))
                .await;
            let units = match &answer {
                Ok(BatchDecision::Granted(g)) => g.units,
                _ => 0,
            };
            let _ = ask
                .reply
                .send(answer.map_err(|e| CoalesceError::Limiter(Arc::new(e))));
            (ask.seller, units)
        });
        let decided = futures::future::join_all(calls).await;
        drop(slot);
        let granted: Vec<(&str, u64)> = decided
            .iter()
            .filter(|(_, units)| *units > 0)
            .map(|(seller, units)| (seller.as_str(), *units))
            .collect();
        limiter.shadow_granted(&granted, None).await;
        return;
    }
    let (asks, senders): (Vec<(String, Vec<u64>)>, Vec<_>) = batch
        .into_iter()
        .map(|a| ((a.seller, a.costs), a.reply))
        .unzip();
    let lists: Vec<(&str, &[u64])> = asks
        .iter()
        .map(|(seller, costs)| (seller.as_str(), costs.as_slice()))
        .collect();
    let answers = limiter.decide_jobs_many(&lists, false, None).await;
    let granted = granted_units(&lists, &answers);
    for (reply, answer) in senders.into_iter().zip(answers) {
        let _ = reply.send(answer.map_err(CoalesceError::Limiter));
    }
    drop(slot);
    limiter.shadow_granted(&granted, None).await;
}
