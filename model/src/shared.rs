//! [`Shared`]: a value shared copy-on-write between the clones of what
//! holds it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

/// A value that clones share until one of them writes to it: a clone is a
/// reference count, and the first mutable borrow of a shared value copies
/// it ([`Arc::make_mut`]). Reads and writes go through `Deref` and
/// `DerefMut`, so code that holds a `Shared<T>` reads as if it held a `T`.
///
/// The model checker clones the [`World`](crate::world::World) for every
/// successor of every state, and most steps leave Postgres or Redis
/// untouched: sharing them makes those clones (and the drops of repeated
/// states) a count instead of a deep copy. Everyone else holds a world
/// alone, where a write costs one check of the count.
///
/// A shared value also keeps one number derived from it ([`Shared::memo`]),
/// until the next write: the checker's fingerprint of it, computed once for
/// every state that shares it.
#[derive(Default)]
pub struct Shared<T>(Arc<Inner<T>>);

#[derive(Default)]
struct Inner<T> {
    value: T,
    memo: OnceLock<u64>,
}

/// A copy (made by the first write to a shared value) derives its memo
/// afresh.
impl<T: Clone> Clone for Inner<T> {
    fn clone(&self) -> Self {
        Inner {
            value: self.value.clone(),
            memo: OnceLock::new(),
        }
    }
}

impl<T> Shared<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Shared(Arc::new(Inner {
            value,
            memo: OnceLock::new(),
        }))
    }

    /// `derive(value)`, computed once per version of the value: kept until
    /// the next write, and shared by the clones that share the value. Every
    /// caller must pass the same function.
    pub fn memo(&self, derive: impl FnOnce(&T) -> u64) -> u64 {
        *self.0.memo.get_or_init(|| derive(&self.0.value))
    }

    /// Whether `a` and `b` share one value (equal, without comparing it).
    #[must_use]
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        let inner = Arc::make_mut(&mut self.0);
        inner.memo.take();
        &mut inner.value
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Shared::ptr_eq(self, other) || **self == **other
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (**self).hash(h);
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Shared::new)
    }
}

#[cfg(test)]
mod tests {
    use super::Shared;

    #[test]
    fn a_write_copies_a_shared_value_and_leaves_its_clones_alone() {
        let a = Shared::new(vec![1]);
        let mut b = a.clone();
        assert!(Shared::ptr_eq(&a, &b));
        b.push(2);
        assert!(!Shared::ptr_eq(&a, &b));
        assert_eq!((&*a, &*b), (&vec![1], &vec![1, 2]));
        // A value held alone is written in place.
        let before: *const Vec<i32> = &*b;
        b.push(3);
        assert!(std::ptr::eq(before, &*b));
    }

    #[test]
    fn a_memo_is_shared_by_clones_and_dropped_by_a_write() {
        let sum = |v: &Vec<u64>| v.iter().sum();
        let mut a = Shared::new(vec![1, 2]);
        assert_eq!(a.memo(sum), 3);
        let b = a.clone();
        assert_eq!(b.memo(|_| unreachable!("kept from a")), 3);
        a.push(3);
        assert_eq!(a.memo(sum), 6);
        assert_eq!(b.memo(sum), 3);
    }
}
