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
/// A shared value also keeps one value `M` derived from it
/// ([`Shared::memo`]), until the next write: the checker's fingerprint of
/// it, computed once for every state that shares it.
pub struct Shared<T, M = u64>(Arc<Inner<T, M>>);

struct Inner<T, M> {
    value: T,
    memo: OnceLock<M>,
}

/// A copy (made by the first write to a shared value) derives its memo
/// afresh.
impl<T: Clone, M> Clone for Inner<T, M> {
    fn clone(&self) -> Self {
        Inner {
            value: self.value.clone(),
            memo: OnceLock::new(),
        }
    }
}

impl<T, M> Shared<T, M> {
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
    pub fn memo(&self, derive: impl FnOnce(&T) -> M) -> M
    where
        M: Copy,
    {
        *self.0.memo.get_or_init(|| derive(&self.0.value))
    }

    /// Whether `a` and `b` share one value (equal, without comparing it).
    #[must_use]
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T: Default, M> Default for Shared<T, M> {
    fn default() -> Self {
        Shared::new(T::default())
    }
}

impl<T, M> From<T> for Shared<T, M> {
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}

impl<T, M> Clone for Shared<T, M> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T, M> Deref for Shared<T, M> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T: Clone, M> DerefMut for Shared<T, M> {
    fn deref_mut(&mut self) -> &mut T {
        let inner = Arc::make_mut(&mut self.0);
        inner.memo.take();
        &mut inner.value
    }
}

impl<T: PartialEq, M> PartialEq for Shared<T, M> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || **self == **other
    }
}

impl<T: Eq, M> Eq for Shared<T, M> {}

impl<T: Hash, M> Hash for Shared<T, M> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (**self).hash(h);
    }
}

impl<T: fmt::Debug, M> fmt::Debug for Shared<T, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: Serialize, M> Serialize for Shared<T, M> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de, T: Deserialize<'de>, M> Deserialize<'de> for Shared<T, M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Shared::new)
    }
}

#[cfg(test)]
mod tests {
    use super::Shared;

    #[test]
    fn a_write_copies_a_shared_value_and_leaves_its_clones_alone() {
        let a: Shared<Vec<i32>> = Shared::new(vec![1]);
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
        let mut a: Shared<Vec<u64>> = Shared::new(vec![1, 2]);
        assert_eq!(a.memo(sum), 3);
        let b = a.clone();
        assert_eq!(b.memo(|_| unreachable!("kept from a")), 3);
        a.push(3);
        assert_eq!(a.memo(sum), 6);
        assert_eq!(b.memo(sum), 3);
    }
}
