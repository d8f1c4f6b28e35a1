//! A seller's live state, rule by rule, charging nothing: what
//! `limits show` prints. Each rule is read on its own with a dry-run jobs
//! call of one unit, so an operator sees which rule holds the seller and
//! for how long.

use std::time::Duration;

use super::core::{Limiter, LimiterError};
use super::decision::BatchDecision;
use super::policy::Resolved;
use super::rule::Rule;
use super::script::{BlockAt, StateKey};
use super::store::Store;

/// Which list a rule comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// The seller's own rules (default, tier, its own or an override).
    Seller,
    /// Over all sellers together.
    Global,
    /// The seller's shadow rules: counted, never holding a job.
    Shadow,
    /// Global shadow rules.
    GlobalShadow,
}

impl RuleKind {
    pub fn name(self) -> &'static str {
        match self {
            RuleKind::Seller => "seller",
            RuleKind::Global => "global",
            RuleKind::Shadow => "shadow",
            RuleKind::GlobalShadow => "global_shadow",
        }
    }
}

/// One rule's state now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleState {
    pub rule: Rule,
    pub kind: RuleKind,
    /// Units it admits now.
    pub remaining: u64,
    /// Until it admits one unit (zero when it does now).
    pub retry_after: Duration,
    /// Until it is back to full: exact when it admits nothing now, else at
    /// most one unit's worth (period / limit) late.
    pub reset_after: Duration,
}

/// A seller's rules and their state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SellerState {
    /// Its tier label (see [`super::Policy::tier_of`]).
    pub tier: String,
    pub unlimited: bool,
    pub rules: Vec<RuleState>,
    /// What is left of a downstream 429 block, if one holds it.
    pub blocked_for: Option<Duration>,
}

impl<S: Store> Limiter<S> {
    /// Reads `seller`'s state under every rule it is held to now (its own,
    /// the global ones, the shadow ones) and its 429 block, on Redis' clock
    /// (or `at_us`), writing nothing.
    pub async fn inspect(
        &self,
        seller: &str,
        at_us: Option<u64>,
    ) -> Result<SellerState, LimiterError<S::Error>> {
        let policy = self.policy();
        // Each rule with the key of its state and the block key of a call
        // that reads it alone: one nothing writes, so the 429 block (read
        // separately below) does not hide the rule's own state.
        let (own, global, unlimited) = match policy.resolve(seller) {
            Resolved::Unlimited => (&[][..], &[][..], true),
            Resolved::Limited {
                seller: own,
                global,
            } => (own, global, false),
        };
        // Shadow rules skip unlimited sellers, as enforced global rules do.
        let (own_shadow, global_shadow) = if unlimited {
            (&[][..], &[][..])
        } else {
            policy.shadow(seller)
        };
        let mut listed: Vec<(Rule, RuleKind, StateKey, BlockAt)> = Vec::new();
        let lists = [
            (self.keys.own_rules(seller, own), RuleKind::Seller),
            (self.keys.global_rules(global), RuleKind::Global),
            (self.keys.shadow_rules(seller, own_shadow), RuleKind::Shadow),
            (
                self.keys.global_shadow_rules(global_shadow),
                RuleKind::GlobalShadow,
            ),
        ];
        for (rules, kind) in lists {
            let global = matches!(kind, RuleKind::Global | RuleKind::GlobalShadow);
            let block = if global {
                self.keys.global_block_at()
            } else {
                self.keys.unblocked_at(seller)
            };
            for (at, r) in rules {
                listed.push((r, kind, at, block.clone()));
            }
        }
        let mut rules = Vec::with_capacity(listed.len());
        for (rule, kind, key, block_key) in listed {
            // One unit, dry: a grant reports what is left after it and
            // when the rule is full again after it, so what it admits now
            // is one more, and a rule with all of its capacity left is
            // full now.
            let one = self.dry_run(at_us, block_key, vec![(key, rule)], &[1]);
            let state = match one.await? {
                BatchDecision::Granted(g) => {
                    let remaining = g.remaining.saturating_add(1).min(rule.capacity());
                    RuleState {
                        rule,
                        kind,
                        remaining,
                        retry_after: Duration::ZERO,
                        reset_after: if remaining >= rule.capacity() {
                            Duration::ZERO
                        } else {
                            g.reset_after
                        },
                    }
                }
                BatchDecision::Denied(d) => RuleState {
                    rule,
                    kind,
                    remaining: 0,
                    retry_after: d.retry_after,
                    reset_after: d.reset_after,
                },
                BatchDecision::Never(_) => RuleState {
                    rule,
                    kind,
                    remaining: 0,
                    retry_after: Duration::ZERO,
                    reset_after: Duration::ZERO,
                },
            };
            rules.push(state);
        }
        // No rules and the seller's block: refused only by a 429 block.
        let block = self.dry_run(at_us, self.keys.block_at(seller), Vec::new(), &[1]);
        let blocked_for = match block.await? {
            BatchDecision::Denied(d) => Some(d.retry_after),
            _ => None,
        };
        Ok(SellerState {
            tier: policy.tier_of(seller).to_owned(),
            unlimited,
            rules,
            blocked_for,
        })
    }
}
