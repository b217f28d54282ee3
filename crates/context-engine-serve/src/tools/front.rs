//! The engine-tool rounds of the Anthropic Messages and Responses fronts,
//! written once over what differs between the two APIs ([`FrontApi`]):
//! how a tool call shows in an answer or an event, how a resolved round
//! goes back in the next request, and what the client gets of held events.
//!
//! A non-streamed answer goes through [`FrontAnswers`] (the rounds loop
//! of [`super::resolve_with`]); a stream through [`FrontRounds`]: events
//! pass through until one opens a part (a block, an item) the API holds
//! from; from there the round's events are held. When the round ends, the
//! held calls are resolved and the continuation's events are relayed as
//! the rest of the same answer (renumbered after the parts the client
//! has), or the held events go out with the engine's parts removed and the
//! later indices closed up.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::marker::PhantomData;

use bytes::Bytes;
use serde_json::{Value, json};

use super::{
    Answers, Calls, EngineTools, HeldEvent, Resend, Rounds, list_of, replay_held, request_with_list,
};
use crate::body::ChatBody;
use crate::session::Managed;
use crate::sse::Event;

/// Whether a part of a streamed answer starts holding the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// No: it goes to the client.
    No,
    /// Yes: an engine call.
    Yes,
    /// Until the next part that is not one of these shows (Responses'
    /// reasoning items): held with the round if that part is an engine
    /// call, released with it otherwise.
    Tentative,
}

/// Who runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The engine, here in the proxy.
    Engine,
    /// The client.
    Client,
}

/// Whether `part` calls an engine tool.
fn is_engine<A: FrontApi>(tools: &EngineTools, part: &Value) -> bool {
    A::call(tools, part) == Some(Caller::Engine)
}

/// Whether `part` is a call the client has to run.
fn is_client<A: FrontApi>(tools: &EngineTools, part: &Value) -> bool {
    A::call(tools, part) == Some(Caller::Client)
}

/// The parts of an answer; `None` for an answer this API's reader does
/// not know.
fn parts_of<A: FrontApi>(answer: &Value) -> Option<&Vec<Value>> {
    answer.get(A::PARTS).and_then(Value::as_array)
}

/// What one event of a stream is to the rounds.
#[derive(Debug)]
pub enum Seen {
    /// The start of the message or response: a continuation's is dropped.
    Start,
    /// Opens (or completes) the part at this index with this value.
    Part(usize, Value),
    /// Adds to the part at this index.
    Delta(usize),
    /// The last event of a round.
    End,
    /// An error that ends the round.
    Failed,
    /// Anything else.
    Other,
}

/// What differs between the fronts' APIs, as the rounds loop reads and
/// writes them. Implemented by [`super::anthropic::Messages`] and
/// [`super::responses::Responses`]; the value is the per-stream state
/// the API needs (numbering), the associated functions are stateless.
pub trait FrontApi: Send + Debug + Default + 'static {
    /// The request's conversation field: `messages` or `input`.
    const LIST: &'static str;
    /// An answer's field of parts: `content` or `output`.
    const PARTS: &'static str;
    /// The field an event names its part by.
    const INDEX: &'static str;
    /// Whether only the parts from the first held one decide whether a
    /// held round may be resolved (else every part of the round does).
    const CALLS_FROM_HOLD: bool;
    /// One part of a streamed answer, as its events build it.
    type Part: StreamPart;

    /// Whose call `part` is, if it is one.
    fn call(tools: &EngineTools, part: &Value) -> Option<Caller>;
    /// The exchange of a resolved round whose answer had `parts`: the
    /// answer as the model wrote it, then the engine's answer to each call.
    fn exchange(guard: &mut Option<Managed>, parts: &[Value]) -> Vec<String>;
    /// What a stream shows the client of a resolved non-streamed round.
    fn shown(tools: &EngineTools, answer: &Value) -> Vec<Value>;
    /// The non-streamed answer for the client: what it was shown of the
    /// resolved rounds first, the engine's calls removed.
    fn finish(tools: &EngineTools, answer: &mut Value, shown: Vec<Value>);

    /// What the event `kind` (`event`, about the part at `index` if any)
    /// is to the rounds; `continuing` when the stream is a continuation.
    fn seen(&mut self, kind: &str, event: &Value, index: Option<usize>, continuing: bool) -> Seen;
    /// Whether `part` is held until the next part shows (see
    /// [`Hold::Tentative`]).
    fn tentative(_part: &Value) -> bool {
        false
    }
    /// The parts a client must not get of `parts` (by index): the
    /// engine's calls.
    fn dropped<'a>(
        tools: &EngineTools,
        parts: impl Iterator<Item = Option<&'a Value>>,
    ) -> BTreeSet<usize> {
        parts
            .enumerate()
            .filter(|(_, p)| p.is_some_and(|p| is_engine::<Self>(tools, p)))
            .map(|(i, _)| i)
            .collect()
    }
    /// Whether the event `kind` ends the answer (a note goes before it
    /// when the client got no part).
    fn ends_answer(kind: &str) -> bool;
    /// Fixes a held event of the whole answer for the client (`calls_left`:
    /// whether it keeps any call of the client's); whether it changed.
    fn whole(kind: &str, event: &mut Value, calls_left: bool) -> bool;
    /// The events of a note at the client's index `index`, for an answer
    /// that would reach the client with no part at all.
    fn note(index: usize) -> Vec<(&'static str, Value)>;
    /// The events that end the client's stream as failed with `message`.
    fn failure(message: &str) -> Vec<(&'static str, Value)>;
    /// An event of the first round went to the client as it came.
    fn passed(&mut self, kind: &str, event: &Value);
    /// Renumbers an event the proxy writes; whether it must be written
    /// again even when its part's index stays.
    fn rewrite(&mut self, kind: &str, event: &mut Value) -> bool;
}

/// One part (block, item) of a streamed answer, as its events build it.
pub trait StreamPart: Send + Debug {
    /// A part opened as `value`.
    fn open(value: Value) -> Self;
    /// Adds a delta event (about this part) to it.
    fn delta(&mut self, event: &Value);
    /// The part as it opened (what tells a call).
    fn value(&self) -> &Value;
    /// The part as the model wrote it.
    fn finished(&self) -> Value;
}

/// A part that comes whole (Responses' items, `output_item.done`): its
/// deltas (text, most of a stream) are not read.
impl StreamPart for Value {
    fn open(value: Value) -> Value {
        value
    }

    fn delta(&mut self, _event: &Value) {}

    fn value(&self) -> &Value {
        self
    }

    fn finished(&self) -> Value {
        self.clone()
    }
}

/// The answers of a non-streamed request of one front.
pub(crate) struct FrontAnswers<'a, 'b, A> {
    body: &'a ChatBody<'b>,
    overrides: &'a [(&'a str, String)],
    list: String,
    tools: &'a EngineTools,
    api: PhantomData<A>,
}

impl<'a, 'b, A: FrontApi> FrontAnswers<'a, 'b, A> {
    /// The answers of a request sent with `overrides` over the client's
    /// `body`, `tools` offered.
    pub(crate) fn new(
        body: &'a ChatBody<'b>,
        overrides: &'a [(&'a str, String)],
        tools: &'a EngineTools,
    ) -> Self {
        FrontAnswers {
            body,
            overrides,
            list: list_of(body, overrides, A::LIST),
            tools,
            api: PhantomData,
        }
    }
}

impl<A: FrontApi> Answers for FrontAnswers<'_, '_, A> {
    fn request(&self, exchange: &[String], tools: &str) -> Bytes {
        request_with_list(
            self.body,
            self.overrides,
            (A::LIST, &self.list),
            exchange,
            tools,
        )
    }

    fn calls(&self, answer: &Value) -> Option<Calls> {
        let parts = parts_of::<A>(answer)?;
        let count = |is: fn(&EngineTools, &Value) -> bool| {
            parts.iter().filter(|p| is(self.tools, p)).count()
        };
        Some(Calls {
            engine: count(is_engine::<A>),
            client: count(is_client::<A>),
        })
    }

    fn exchange(&self, guard: &mut Option<Managed>, answer: &Value) -> Vec<String> {
        let parts = parts_of::<A>(answer).map(Vec::as_slice);
        A::exchange(guard, parts.unwrap_or_default())
    }

    fn shown(&self, answer: &Value) -> Vec<Value> {
        A::shown(self.tools, answer)
    }

    fn finish(&self, answer: &mut Value, shown: Vec<Value>) {
        A::finish(self.tools, answer, shown);
    }
}

/// A stream's engine-tool rounds on one front: reads the events of each
/// round's stream, holds a round from its first engine call, and writes
/// what the client gets.
#[derive(Debug)]
pub struct FrontRounds<A: FrontApi> {
    /// The tools offered.
    pub tools: EngineTools,
    api: A,
    resend: Resend,
    /// The client's index of this round's part 0.
    offset: usize,
    /// This round's parts, by index.
    parts: Vec<Option<A::Part>>,
    /// The index of the part the round is held from.
    hold_from: Option<usize>,
    /// The hold is tentative so far ([`Hold::Tentative`]).
    tentative: bool,
    held: Vec<Event>,
    /// The round's last event went by.
    ended: bool,
    errored: bool,
    /// Parts the client has been told of.
    sent: usize,
}

impl<A: FrontApi> FrontRounds<A> {
    /// The rounds of a stream sent with `overrides` over the client's
    /// `body`, at most `max_rounds`.
    pub fn new(
        tools: EngineTools,
        body: Bytes,
        overrides: Vec<(&'static str, String)>,
        max_rounds: u32,
    ) -> FrontRounds<A> {
        FrontRounds {
            tools,
            api: A::default(),
            resend: Resend::new(body, overrides, A::LIST, max_rounds),
            offset: 0,
            parts: Vec::new(),
            hold_from: None,
            tentative: false,
            held: Vec::new(),
            ended: false,
            errored: false,
            sent: 0,
        }
    }

    fn values(&self) -> impl Iterator<Item = Option<&Value>> {
        self.parts.iter().map(|p| p.as_ref().map(StreamPart::value))
    }

    /// Writes `v` (the event `kind`) for the client: at the client's index
    /// `client_index` if it is about a part, renumbered by the API; as it
    /// came (`raw`) when nothing changed.
    fn write(
        &mut self,
        kind: &str,
        v: &mut Value,
        client_index: Option<usize>,
        raw: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) {
        if let Some(i) = client_index {
            v[A::INDEX] = json!(i);
            self.sent = self.sent.max(i + 1);
        }
        let rewritten = self.api.rewrite(kind, v);
        match raw {
            Some(raw) if client_index.is_none() && !rewritten => out.extend_from_slice(raw),
            _ => out.extend(crate::cut::encode(kind, v)),
        }
    }

    /// Writes the note for an answer the client got no part of.
    fn note(&mut self, out: &mut Vec<u8>) {
        let index = self.sent;
        for (kind, mut v) in A::note(index) {
            self.write(kind, &mut v, Some(index), None, out);
        }
    }

    /// Opens part `i` as `value`, holding the round from it if the API
    /// says so (a tentative hold ends here, released or kept).
    fn open(&mut self, i: usize, value: Value, out: &mut Vec<u8>) {
        let hold = if is_engine::<A>(&self.tools, &value) {
            Hold::Yes
        } else if A::tentative(&value) {
            Hold::Tentative
        } else {
            Hold::No
        };
        match (self.hold_from, hold) {
            (None, Hold::Yes | Hold::Tentative) => {
                self.hold_from = Some(i);
                self.tentative = hold == Hold::Tentative;
            }
            (Some(_), Hold::Yes) if self.tentative => self.tentative = false,
            (Some(_), Hold::No) if self.tentative => {
                self.tentative = false;
                let released = self.release_held();
                out.extend(released);
            }
            _ => {}
        }
        if self.parts.len() <= i {
            self.parts.resize_with(i + 1, || None);
        }
        self.parts[i] = Some(A::Part::open(value));
    }

    fn read(&mut self, event: &Event, out: &mut Vec<u8>) {
        let raw = &event.raw[..];
        let Some(v) = event.object() else {
            // Not an event of the API (a comment, a keep-alive).
            if self.holding() {
                self.held.push(event.clone());
            } else {
                out.extend_from_slice(raw);
            }
            return;
        };
        let kind = event.kind();
        let index = index_of::<A>(v);
        let continuing = self.resend.continuing();
        match self.api.seen(kind, v, index, continuing) {
            // A continuation's events are the rest of the client's answer.
            Seen::Start if continuing => return,
            Seen::Part(i, value) => self.open(i, value, out),
            Seen::Delta(i) => {
                if let Some(Some(part)) = self.parts.get_mut(i) {
                    part.delta(v);
                }
            }
            Seen::End => self.ended = true,
            Seen::Failed => {
                self.ended = true;
                self.errored = true;
            }
            Seen::Start | Seen::Other => {}
        }
        if self.holding() {
            self.held.push(event.clone());
            return;
        }
        if continuing {
            let client_index = index.map(|i| self.offset + i);
            self.write(kind, &mut v.clone(), client_index, Some(raw), out);
            return;
        }
        // The first round goes out as it came.
        if let Some(i) = index {
            self.sent = self.sent.max(i + 1);
        }
        self.api.passed(kind, v);
        out.extend_from_slice(raw);
    }
}

/// The index of the part an event is about.
fn index_of<A: FrontApi>(event: &Value) -> Option<usize> {
    event
        .get(A::INDEX)
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
}

impl<A: FrontApi> Rounds for FrontRounds<A> {
    fn event(&mut self, event: &Event, out: &mut Vec<u8>) {
        self.read(event, out);
    }

    fn holding(&self) -> bool {
        self.hold_from.is_some()
    }

    fn ended(&self) -> bool {
        self.ended
    }

    fn resolvable(&self) -> bool {
        let Some(from) = self.hold_from else {
            return false;
        };
        let from = if A::CALLS_FROM_HOLD { from } else { 0 };
        !self.tentative
            && self.ended
            && !self.errored
            && self.resend.may_resolve()
            && !self
                .values()
                .skip(from)
                .flatten()
                .any(|p| is_client::<A>(&self.tools, p))
    }

    fn next_request(&mut self, guard: &mut Option<Managed>) -> Bytes {
        let round: Vec<Value> = self
            .parts
            .iter()
            .flatten()
            .map(StreamPart::finished)
            .collect();
        let items = A::exchange(guard, &round);
        self.offset = self.sent;
        self.parts.clear();
        self.hold_from = None;
        self.tentative = false;
        self.held.clear();
        self.ended = false;
        self.resend.next(items, &self.tools.tools_json)
    }

    fn release_held(&mut self) -> Vec<u8> {
        self.tentative = false;
        let Some(from) = self.hold_from.take() else {
            return Vec::new();
        };
        let removed: BTreeSet<usize> = A::dropped(&self.tools, self.values())
            .into_iter()
            .filter(|&k| k >= from)
            .collect();
        let calls_left = self
            .values()
            .flatten()
            .any(|p| is_client::<A>(&self.tools, p));
        let held = std::mem::take(&mut self.held);
        replay_held(held, A::INDEX, &removed, |e, out| match e {
            HeldEvent::Indexed {
                kind,
                mut event,
                index,
            } => {
                let client_index = self.offset + index;
                self.write(&kind, &mut event, Some(client_index), None, out);
            }
            HeldEvent::Whole {
                kind,
                mut event,
                raw,
            } => {
                if A::ends_answer(&kind) && self.sent == 0 {
                    self.note(out);
                }
                let changed = A::whole(&kind, &mut event, calls_left);
                let raw = (!changed).then_some(raw);
                self.write(&kind, &mut event, None, raw, out);
            }
            HeldEvent::Raw(raw) => out.extend_from_slice(raw),
        })
    }

    fn fail(&mut self, message: &str) -> Vec<u8> {
        self.hold_from = None;
        self.tentative = false;
        self.held.clear();
        let mut out = Vec::new();
        for (kind, mut event) in A::failure(message) {
            self.write(kind, &mut event, None, None, &mut out);
        }
        out
    }
}
