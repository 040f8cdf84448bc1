//! The rate-limit header fields of a response, formatted once per layer,
//! group and limit and kept per thread.

use super::*;

/// What a thread keeps of layer `layer`'s group `group` with this quota
/// and window: its `RateLimit-Policy` value and the start of its
/// `RateLimit` value (`"name";r=`).
struct Kept {
    layer: u64,
    group: usize,
    quota: u64,
    window: u64,
    policy: HeaderValue,
    current: Box<[u8]>,
}

/// Kept fields per thread (direct-mapped; a collision only formats again).
const KEPT_SLOTS: usize = 16;

thread_local! {
    static KEPT: RefCell<[Option<Kept>; KEPT_SLOTS]> =
        const { RefCell::new([const { None }; KEPT_SLOTS]) };
}

/// The `RateLimit-Policy` and `RateLimit` values of `decision` of group
/// `group` (named `name`) of layer `layer` under `limit`. The policy is the
/// same for every request until the limit changes, so each thread formats
/// it once and hands out clones (a reference count, no allocation), with
/// the start of the current value; the current value is one allocation of
/// its exact length. Kept by the layer's unique id, the group and the
/// figures the policy shows, so a changed limit gets its own values.
pub(super) fn kept_fields(
    layer: u64,
    group: usize,
    name: &str,
    decision: &Decision,
    limit: &Limit,
) -> Option<Fields> {
    let (quota, window) = (decision.limit(), refusal::window_secs(limit));
    let format = || {
        let mut policy = String::with_capacity(name.len() + 32);
        let _ = refusal::write_policy(&mut policy, name, quota, window);
        let mut current = String::with_capacity(name.len() + 8);
        let _ = refusal::push_sf_string(&mut current, name);
        current.push_str(";r=");
        Some(Kept {
            layer,
            group,
            quota,
            window,
            policy: HeaderValue::try_from(policy).ok()?,
            current: current.into_bytes().into_boxed_slice(),
        })
    };
    let fields = |kept: &Kept| Some((kept.policy.clone(), current_field(&kept.current, decision)?));
    let slot = (layer as usize).wrapping_mul(31).wrapping_add(group) % KEPT_SLOTS;
    let found = KEPT.try_with(|all| {
        let Ok(mut all) = all.try_borrow_mut() else {
            return fields(&format()?);
        };
        let entry = &mut all[slot];
        match entry {
            Some(kept)
                if kept.layer == layer
                    && kept.group == group
                    && kept.quota == quota
                    && kept.window == window =>
            {
                fields(kept)
            }
            _ => fields(entry.insert(format()?)),
        }
    });
    match found {
        Ok(found) => found,
        // Thread-local storage is being torn down.
        Err(_) => fields(&format()?),
    }
}

/// The `RateLimit` fields of a tiered call's binding limit (its name the
/// tier's), formatted each time.
#[inline(never)]
pub(super) fn tiered_fields(permit: &Permit<'_>) -> Option<Fields> {
    let (name, decision, limit) = permit.binding()?;
    let (policy, current) = refusal::fields(name, &decision, &limit);
    Some((
        HeaderValue::try_from(policy).ok()?,
        HeaderValue::try_from(current).ok()?,
    ))
}

/// The `RateLimit` value of `decision`: `start` (`"name";r=`), then its
/// figures, assembled on the stack and copied once into the value's own
/// buffer (of its exact length: one allocation).
fn current_field(start: &[u8], decision: &Decision) -> Option<HeaderValue> {
    let mut text = [0u8; 160];
    let (mut remaining, mut reset) = (itoa::Buffer::new(), itoa::Buffer::new());
    let remaining = remaining.format(decision.remaining()).as_bytes();
    let reset = reset.format(decision.reset_after_secs()).as_bytes();
    let len = start.len() + remaining.len() + 3 + reset.len();
    if len > text.len() {
        // A very long name: on the heap.
        return HeaderValue::from_maybe_shared(Bytes::from(
            [start, remaining, b";t=", reset].concat(),
        ))
        .ok();
    }
    let mut at = 0;
    for part in [start, remaining, b";t=", reset] {
        text[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    HeaderValue::from_maybe_shared(Bytes::copy_from_slice(&text[..len])).ok()
}
