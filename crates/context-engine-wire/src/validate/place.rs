//! Where a message may be put: whether a message of a given role can stand
//! between two kept messages, and whether a rewrite brought two messages of
//! the same role together.
//!
//! Engines that insert a message (a summary, a note) ask here instead of
//! re-deriving turn order. Every profile refuses a *new* same-role adjacency
//! (two user or two assistant turns in a row): OpenAI accepts them, but
//! Anthropic-compatible endpoints, many local chat templates ("roles must
//! alternate") and strict gateways do not, and avoiding them costs an
//! engine nothing. The OpenAI profile keeps the relaxations that would cost
//! something to avoid: a user message may follow tool results, and the
//! conversation may start with an assistant turn. [`Profile::Strict`] refuses
//! those too, as [`super::StrictAlternation`] does.

use super::Profile;
use super::strict::Side;
use crate::message::{Message, Role};

/// The side of the conversation a message of `role` lands on.
fn side_of_role(role: &Role) -> Side {
    match role {
        Role::User => Side::User,
        Role::Tool | Role::Function => Side::Result,
        Role::Assistant => Side::Assistant,
        Role::System | Role::Developer | Role::Other(_) => Side::Skip,
    }
}

/// Whether a turn on side `y` may directly follow one on side `x` under
/// `profile` (both conversational).
fn may_follow(x: Side, y: Side, profile: Profile) -> bool {
    match (x, y) {
        (Side::Assistant, Side::Assistant) | (Side::User, Side::User) => false,
        (Side::Result, Side::User) | (Side::User, Side::Result) => profile != Profile::Strict,
        _ => true,
    }
}

/// The side of the last conversational message of `messages`.
fn last_side(messages: &[Message]) -> Option<Side> {
    messages
        .iter()
        .rev()
        .map(Side::of)
        .find(|s| *s != Side::Skip)
}

/// The side of the first conversational message of `messages`.
fn first_side(messages: &[Message]) -> Option<Side> {
    messages.iter().map(Side::of).find(|s| *s != Side::Skip)
}

/// Whether the messages of `after` may directly follow those of `before`
/// under `profile`: the last conversational message of `before` and the
/// first of `after` are not a new same-role pair, and, under the strict
/// profile, a conversation that `before` does not start begins with a user
/// message.
pub fn may_join(before: &[Message], after: &[Message], profile: Profile) -> bool {
    match (last_side(before), first_side(after)) {
        (Some(x), Some(y)) => may_follow(x, y, profile),
        (None, Some(y)) => profile != Profile::Strict || y == Side::User,
        (_, None) => true,
    }
}

/// Whether a new message of `role` may be put between `before` and `after`
/// (see [`may_join`]) under `profile`.
pub fn may_place(before: &[Message], role: &Role, after: &[Message], profile: Profile) -> bool {
    let side = side_of_role(role);
    if side == Side::Skip {
        return true;
    }
    let prev_ok = match last_side(before) {
        Some(x) => may_follow(x, side, profile),
        None => profile != Profile::Strict || side == Side::User,
    };
    prev_ok && first_side(after).is_none_or(|y| may_follow(side, y, profile))
}

/// Index (in `output`) of the first adjacency `profile` refuses (see the
/// module docs) beyond those `input` already had: refused pairs are
/// counted by kind (two user turns, two assistant turns, a user turn after
/// results), as [`super::introduced_violation`] counts violations, so a
/// rewrite that clips a message of a pair the agent wrote does not count
/// it as new. `None` when the rewrite brought no new pair together.
pub fn introduced_adjacency(
    input: &[Message],
    output: &[Message],
    profile: Profile,
) -> Option<usize> {
    let mut had: Vec<(Side, Side)> = refused_pairs(input, profile)
        .map(|(a, b)| (Side::of(&input[a]), Side::of(&input[b])))
        .collect();
    for (a, b) in refused_pairs(output, profile) {
        let kind = (Side::of(&output[a]), Side::of(&output[b]));
        match had.iter().position(|k| *k == kind) {
            Some(k) => {
                had.swap_remove(k);
            }
            None => return Some(b),
        }
    }
    None
}

/// Consecutive conversational messages `(a, b)` (instructions and unknown
/// roles stepped over) that `profile` refuses to put next to each other.
fn refused_pairs(
    messages: &[Message],
    profile: Profile,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut previous: Option<(usize, Side)> = None;
    messages.iter().enumerate().filter_map(move |(i, m)| {
        let side = Side::of(m);
        if side == Side::Skip {
            return None;
        }
        let pair = previous
            .filter(|(_, x)| !may_follow(*x, side, profile))
            .map(|(k, _)| (k, i));
        previous = Some((i, side));
        pair
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_role_pairs_are_refused_under_every_profile() {
        let user = [Message::user("u")];
        let asst = [Message::assistant("a")];
        let tool = [Message::tool_result("c", "r")];
        let sys = [Message::system("s")];
        for profile in Profile::ALL {
            assert!(!may_place(&user, &Role::User, &asst, profile));
            assert!(!may_place(&asst, &Role::Assistant, &user, profile));
            assert!(may_place(&asst, &Role::User, &asst, profile));
            assert!(may_place(&sys, &Role::User, &asst, profile));
            assert!(!may_join(&user, &user, profile));
        }
        // The relaxations OpenAI keeps.
        assert!(may_place(&tool, &Role::User, &asst, Profile::OpenAi));
        assert!(!may_place(&tool, &Role::User, &asst, Profile::Strict));
        assert!(may_place(&sys, &Role::Assistant, &user, Profile::OpenAi));
        assert!(!may_place(&sys, &Role::Assistant, &user, Profile::Strict));
    }

    #[test]
    fn only_new_pairs_are_introduced() {
        let input = vec![
            Message::system("s"),
            Message::user("a"),
            Message::user("b"),
            Message::assistant("c"),
        ];
        assert_eq!(introduced_adjacency(&input, &input, Profile::OpenAi), None);
        let output = vec![
            Message::system("s"),
            Message::user("a"),
            Message::user("b"),
            Message::user("summary"),
            Message::assistant("c"),
        ];
        assert_eq!(
            introduced_adjacency(&input, &output, Profile::OpenAi),
            Some(3)
        );
    }
}
