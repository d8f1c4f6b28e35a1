//! Shadow rules (`shadow = true`): decided and counted on live traffic,
//! but never holding a job, so a new limit can be tried before it bites.
//!
//! After the enforced rules grant a seller `n` units, its shadow rules are
//! asked for up to `n` in a call of their own: they are charged what they
//! would have let through, and the rest is counted as `shadow_denied`. Their
//! state therefore follows the traffic the rule would have admitted, and
//! the count tells how many units it would have held back. The extra call
//! is made only for sellers that have shadow rules, after the grant is
//! handed over (the coalescer answers first); a failure of it is counted
//! and logged, and never delays the job.

use crate::config::Topology;
use crate::telemetry::events::ShadowDecided;

use super::core::{unit_jobs, KeyedRule, Limiter};
use super::decision::{BatchDecision, DeniedBy};
use super::script::BlockAt;
use super::store::Store;

impl<S: Store> Limiter<S> {
    /// Runs `seller`'s shadow rules over `units` the enforced rules just
    /// granted. `at_us` is the explicit clock of tests (`None`: Redis').
    pub(super) async fn shadow(&self, seller: &str, units: u64, at_us: Option<u64>) {
        if units == 0 {
            return;
        }
        let policy = self.policy();
        // Unlimited sellers are held by no rule, global ones included.
        if policy.resolve(seller) == super::policy::Resolved::Unlimited {
            return;
        }
        let (own, global) = policy.shadow(seller);
        if own.is_empty() && global.is_empty() {
            return;
        }
        let own: Vec<KeyedRule> = self.keys.shadow_rules(seller, own);
        let global: Vec<KeyedRule> = self.keys.global_shadow_rules(global);
        let tier = policy.tier_of(seller);
        if self.topology == Topology::Single || global.is_empty() || own.is_empty() {
            let offset = 0;
            let (block, rules) = if own.is_empty() {
                (self.keys.global_block_at(), global)
            } else {
                let mut all = own;
                all.extend(global);
                (self.keys.unblocked_at(seller), all)
            };
            self.shadow_call(seller, tier, units, at_us, block, rules, offset)
                .await;
        } else {
            // Redis Cluster: the global keys live in another slot. Each part
            // is its own trial; neither refunds the other.
            let n_own = own.len();
            self.shadow_call(
                seller,
                tier,
                units,
                at_us,
                self.keys.unblocked_at(seller),
                own,
                0,
            )
            .await;
            self.shadow_call(
                seller,
                tier,
                units,
                at_us,
                self.keys.global_block_at(),
                global,
                n_own,
            )
            .await;
        }
    }

    /// One call over shadow rules: grant up to `units`, never blocked by a
    /// 429 (the block key is one nothing writes). `offset` numbers the
    /// rules after those of an earlier part.
    #[allow(clippy::too_many_arguments)]
    async fn shadow_call(
        &self,
        seller: &str,
        tier: &str,
        units: u64,
        at_us: Option<u64>,
        block: BlockAt,
        rules: Vec<KeyedRule>,
        offset: usize,
    ) {
        // Up to `units`, as jobs of one unit each, no more of them than
        // the smallest capacity: a cost above it is granted in part, not
        // refused as impossible.
        let smallest = rules.iter().map(|(_, r)| r.capacity()).min();
        let costs = unit_jobs(units, smallest.unwrap_or(units));
        let (denied, by) = match self.request_alone(at_us, false, block, rules, &costs).await {
            Ok(BatchDecision::Granted(g)) => (units - g.units, None),
            Ok(BatchDecision::Denied(d)) => (
                units,
                match d.by {
                    DeniedBy::Rule(i) => Some(offset + i),
                    _ => None,
                },
            ),
            Ok(BatchDecision::Never(c)) => (units, Some(offset + c.rule)),
            Err(e) => {
                ShadowDecided {
                    seller,
                    tier,
                    units,
                    denied: 0,
                    by: None,
                    error: Some(&e.to_string()),
                }
                .emit();
                return;
            }
        };
        ShadowDecided {
            seller,
            tier,
            units,
            denied,
            by,
            error: None,
        }
        .emit();
    }
}
