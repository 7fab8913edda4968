//! [`SmallList`]: a list that holds one element inline, for the per-request lists whose usual
//! length is one (a program's steps, a scope's requests): no allocation for them.

/// A list of `T` in order: its only element inline, two or more in a `Vec` (the inline one
/// moved there, so that the list is one slice). Invariant: `one` and `more` are never both
/// in use.
pub(crate) struct SmallList<T> {
    /// The only element (`more` empty), or `None`.
    one: Option<T>,
    /// Every element, once there are two or more (`one` then `None`).
    more: Vec<T>,
}

impl<T> Default for SmallList<T> {
    fn default() -> Self {
        SmallList {
            one: None,
            more: Vec::new(),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for SmallList<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl<T> SmallList<T> {
    /// Adds an element at the end. Always inlined, so that an element built in the call is
    /// built in place (a call takes a large one by pointer and copies it: a 430-byte step).
    #[inline(always)]
    pub(crate) fn push(&mut self, x: T) {
        if self.one.is_none() && self.more.is_empty() {
            self.one = Some(x);
        } else {
            self.push_more(x);
        }
    }

    /// [`SmallList::push`] of the second element on.
    fn push_more(&mut self, x: T) {
        if let Some(first) = self.one.take() {
            self.more.push(first);
        }
        self.more.push(x);
    }

    /// The elements, in order.
    pub(crate) fn as_slice(&self) -> &[T] {
        match &self.one {
            Some(x) => std::slice::from_ref(x),
            None => &self.more,
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.one.is_some()) + self.more.len()
    }

    /// Keeps the elements for which `keep` is true, in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        if self.one.as_ref().is_some_and(|x| !keep(x)) {
            self.one = None;
        }
        self.more.retain(keep);
    }

    /// Removes every element (the `Vec`'s allocation, if any, is kept).
    pub(crate) fn clear(&mut self) {
        self.one = None;
        self.more.clear();
    }

    /// The elements as a `Vec`, in order.
    pub(crate) fn into_vec(self) -> Vec<T> {
        match self.one {
            Some(x) => vec![x],
            None => self.more,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_inline_and_in_the_vec() {
        for n in 0..5 {
            let mut l = SmallList::default();
            for i in 0..n {
                l.push(i);
            }
            assert_eq!(l.len(), n);
            assert_eq!(l.as_slice(), (0..n).collect::<Vec<_>>());
            l.retain(|&x| x % 2 == 1);
            let odd: Vec<usize> = (0..n).filter(|x| x % 2 == 1).collect();
            assert_eq!((l.len(), l.as_slice()), (odd.len(), &odd[..]));
            l.push(9);
            let mut c = SmallList::default();
            for &x in l.as_slice() {
                c.push(x);
            }
            c.clear();
            assert_eq!(c.len(), 0);
            c.push(7);
            assert_eq!(c.as_slice(), [7], "after clear, {n}");
            assert_eq!(l.into_vec().last(), Some(&9));
        }
    }
}
