//! The data of the embedded Redis: keys holding strings, hashes or sorted
//! sets, each with an optional expiry on the clock it is handed. Nothing
//! here knows a command's syntax (`commands.rs` does).

use std::collections::HashMap;

/// A key's value, binary-safe as Redis' are (a v2 sliding log packs
/// doubles into a hash field).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(Vec<u8>),
    Hash(HashMap<Vec<u8>, Vec<u8>>),
    ZSet(ZSet),
}

impl Value {
    /// The type's name as `TYPE` answers it (for messages).
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::ZSet(_) => "zset",
        }
    }
}

/// A sorted set: members ordered by score, then by member bytes (Redis'
/// order for equal scores), each member once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZSet {
    /// Sorted by `(score, member)`; no two entries share a member.
    entries: Vec<(f64, Vec<u8>)>,
}

impl ZSet {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry in order, lowest score first.
    pub fn entries(&self) -> &[(f64, Vec<u8>)] {
        &self.entries
    }

    fn position(&self, member: &[u8]) -> Option<usize> {
        self.entries.iter().position(|(_, m)| m == member)
    }

    /// Adds `member` at `score`, or moves it there; true when it is new.
    pub fn insert(&mut self, score: f64, member: &[u8]) -> bool {
        let new = match self.position(member) {
            Some(i) => {
                self.entries.remove(i);
                false
            }
            None => true,
        };
        let at = self
            .entries
            .partition_point(|(s, m)| (*s, m.as_slice()) < (score, member));
        self.entries.insert(at, (score, member.to_vec()));
        new
    }

    /// Removes `member`; true when it was there.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match self.position(member) {
            Some(i) => {
                self.entries.remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes every entry whose score `gone` accepts; how many went.
    pub fn remove_where(&mut self, mut gone: impl FnMut(f64) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(s, _)| !gone(*s));
        before - self.entries.len()
    }
}

/// One key: its value and when it expires (ms on the server's clock; it
/// is gone once the clock is past it, as in Redis: `now > when`).
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    value: Value,
    expires_at_ms: Option<i64>,
}

/// Every key of the server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keyspace {
    entries: HashMap<Vec<u8>, Entry>,
    /// The server process that holds the keys: a restart, or another
    /// server taking over (a failover), is another run (`INFO`'s
    /// `run_id`).
    run: u64,
}

/// Every key of a server at one instant ([`Keyspace::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot(HashMap<Vec<u8>, Entry>);

impl Keyspace {
    /// Drops `key` when it has expired at `now_ms` (Redis expires a key
    /// when it is next touched; nobody can tell the difference).
    fn expire(&mut self, key: &[u8], now_ms: i64) {
        let lapsed = self
            .entries
            .get(key)
            .and_then(|e| e.expires_at_ms)
            .is_some_and(|when| now_ms > when);
        if lapsed {
            self.entries.remove(key);
        }
    }

    /// The live value at `key`.
    pub fn get(&mut self, key: &[u8], now_ms: i64) -> Option<&Value> {
        self.expire(key, now_ms);
        self.entries.get(key).map(|e| &e.value)
    }

    /// The live value at `key`, to change in place. A hash or sorted set
    /// left empty must be removed with [`Keyspace::drop_if_empty`].
    pub fn get_mut(&mut self, key: &[u8], now_ms: i64) -> Option<&mut Value> {
        self.expire(key, now_ms);
        self.entries.get_mut(key).map(|e| &mut e.value)
    }

    /// The value at `key`, made `empty()` first when there is none; its
    /// expiry is kept when it existed.
    pub fn get_or_insert(
        &mut self,
        key: &[u8],
        now_ms: i64,
        empty: impl FnOnce() -> Value,
    ) -> &mut Value {
        self.expire(key, now_ms);
        &mut self
            .entries
            .entry(key.to_vec())
            .or_insert_with(|| Entry {
                value: empty(),
                expires_at_ms: None,
            })
            .value
    }

    /// Sets `key` to `value` with the expiry given (`SET` drops an old one).
    pub fn put(&mut self, key: &[u8], value: Value, expires_at_ms: Option<i64>) {
        self.entries.insert(
            key.to_vec(),
            Entry {
                value,
                expires_at_ms,
            },
        );
    }

    /// Removes `key`; true when it was live.
    pub fn delete(&mut self, key: &[u8], now_ms: i64) -> bool {
        self.expire(key, now_ms);
        self.entries.remove(key).is_some()
    }

    /// Removes `key` when it holds an empty hash or sorted set: Redis
    /// never keeps one.
    pub fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.entries.get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.is_empty(),
            Some(Value::ZSet(z)) => z.is_empty(),
            _ => false,
        };
        if empty {
            self.entries.remove(key);
        }
    }

    /// When the live `key` expires: `None` when it is gone, `Some(None)`
    /// when it has no expiry.
    pub fn expiry(&mut self, key: &[u8], now_ms: i64) -> Option<Option<i64>> {
        self.expire(key, now_ms);
        self.entries.get(key).map(|e| e.expires_at_ms)
    }

    /// Sets the expiry of the live `key`; false when there is none.
    pub fn set_expiry(&mut self, key: &[u8], now_ms: i64, at_ms: i64) -> bool {
        self.expire(key, now_ms);
        match self.entries.get_mut(key) {
            Some(e) => {
                e.expires_at_ms = Some(at_ms);
                true
            }
            None => false,
        }
    }

    /// Every live key, sorted (for tests and dumps).
    pub fn keys(&mut self, now_ms: i64) -> Vec<Vec<u8>> {
        self.entries
            .retain(|_, e| e.expires_at_ms.is_none_or(|when| now_ms <= when));
        let mut keys: Vec<Vec<u8>> = self.entries.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A copy of `key` as it is now, its expiry with it (`None`: no
    /// key), to put back later ([`Keyspace::put_back`]): an older copy
    /// of the data (a replica that missed the last writes, a `DUMP`).
    pub fn copy_of(&self, key: &[u8]) -> Option<(Value, Option<i64>)> {
        self.entries
            .get(key)
            .map(|e| (e.value.clone(), e.expires_at_ms))
    }

    /// Puts `copy` back at `key` ([`Keyspace::copy_of`]): the key as it
    /// was then, or gone when there was none.
    pub fn put_back(&mut self, key: &[u8], copy: Option<(Value, Option<i64>)>) {
        match copy {
            Some((value, expires_at_ms)) => self.put(key, value, expires_at_ms),
            None => {
                self.entries.remove(key);
            }
        }
    }

    /// Every key gone, as after a restart without persistence: another
    /// run of the server.
    pub fn flush(&mut self) {
        self.entries.clear();
        self.run += 1;
    }

    /// The server's run id, as `INFO server` names it (40 hex digits).
    pub fn run_id(&self) -> String {
        format!("{:040x}", self.run)
    }

    /// Every key as it is now, their expiries with them.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.entries.clone())
    }

    /// Another server takes over with `snapshot`'s keys: a replica that
    /// missed the writes since is promoted, or a restart loads an older
    /// save. Every key is as it was then; the run is another.
    pub fn take_over(&mut self, snapshot: Snapshot) {
        self.entries = snapshot.0;
        self.run += 1;
    }
}
