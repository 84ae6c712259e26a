//! The benchmark's front-end to the core: one [`Run`] per episode, every observation handed in
//! and every decision read out through its one surface.
//!
//! Why this module exists: the controller strategies (`self-healing`, `class-agnostic`) must
//! decide as the runtime's agent, the gateway's wire run and the MCP proxy do — through the
//! core's [`Run`], never through a part of it. Told the tools on offer, the run applies the
//! seeds' tool-health rules (a warning at 3 failures in a row naming the alternatives, the tool
//! hidden at 5, a stop only on the failure rate or when nothing else is on offer); the
//! benchmark's conformance test (`tests/conformance.rs`) plays the core's table
//! (`selfheal_core::conformance`) through this type so. The strategies offer nothing (see
//! `run_self_healing`): their plan has fixed steps, and the ladder's end stands. It decides
//! nothing itself: it only keeps the clock, the randomness and what the last decision hid, for
//! the strategy to act on.

use selfheal_core::{
    Action, Breakers, ConfigError, ControllerConfig, Env, Guidance, Input, Observation, Run,
    RunOutcome, RunStatus, SplitMix64, StepAction, StepsBy, Trace, TrustReport,
};

/// What the run says when the episode proposes its answer ([`Healer::propose_answer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proposal {
    /// Read each value no second source confirmed again, `reads` times, reporting each read
    /// as a verdict ([`Healer::decide`]); then propose again.
    ReadAgain {
        /// Reads per value.
        reads: u32,
    },
    /// Answer with this status.
    Answer {
        /// `complete` or `partial`.
        status: RunStatus,
    },
    /// The run was stopped: no answer.
    Stopped,
}

/// One episode's run (see the module documentation).
#[derive(Debug)]
pub struct Healer {
    run: Run,
    rng: SplitMix64,
    breakers: Breakers,
    /// The tools the last decision said not to offer.
    hidden: Vec<String>,
    /// The guidance of the last decision.
    guidance: Vec<Guidance>,
}

impl Healer {
    /// A run under `config` for an agent offered `offered`, its backoff jitter seeded by
    /// `seed`.
    pub fn new(
        config: ControllerConfig,
        offered: &[&str],
        seed: u64,
    ) -> Result<Healer, ConfigError> {
        let mut h = Healer {
            run: Run::new(config)?,
            rng: SplitMix64::new(seed),
            breakers: Breakers::none(),
            hidden: Vec::new(),
            guidance: Vec::new(),
        };
        // Told what the agent is offered, the run routes around a tool that keeps failing
        // while another is left, as for every other front-end.
        h.actions(Input::Offered(offered), 0);
        Ok(h)
    }

    fn actions(&mut self, input: Input<'_>, now_ms: u64) -> Vec<Action> {
        let mut env = Env {
            now_ms,
            rng: &mut self.rng,
            breakers: &mut self.breakers,
        };
        self.run.decide(input, &mut env)
    }

    fn step(&mut self, input: Input<'_>, now_ms: u64) -> StepAction {
        let mut env = Env {
            now_ms,
            rng: &mut self.rng,
            breakers: &mut self.breakers,
        };
        let d = self.run.decide_step(input, &mut env);
        if let StepAction::Proceed {
            guidance,
            hidden_tools,
        } = &d
        {
            self.guidance.clone_from(guidance);
            self.hidden.clone_from(hidden_tools);
        }
        d
    }

    /// Hands the run what the episode observed (a tool or model call that finished, a
    /// verdict) and returns its decision.
    pub fn decide(&mut self, obs: Observation<'_>, now_ms: u64) -> StepAction {
        self.step(Input::Observed(obs), now_ms)
    }

    /// The model is about to write its next call: the guidance it gets and the tools it is
    /// not offered, or the stop (the failure-rate rule).
    pub fn next_turn(&mut self, now_ms: u64) -> StepAction {
        self.step(Input::NextTurn, now_ms)
    }

    /// The episode has its answer (it knows its steps by the plan): whether to read its values
    /// again first, or the status to answer with.
    pub fn propose_answer(&mut self, now_ms: u64) -> Proposal {
        let actions = self.actions(
            Input::AnswerProposed {
                by: StepsBy::Plan,
                answer: None,
            },
            now_ms,
        );
        for a in actions {
            match a {
                Action::ReadAgain { reads } => return Proposal::ReadAgain { reads },
                Action::Answer { status, .. } => return Proposal::Answer { status },
                Action::Stop { .. } => return Proposal::Stopped,
                Action::Proceed { .. }
                | Action::Send { .. }
                | Action::Repair { .. }
                | Action::GiveUp { .. }
                | Action::Recover { .. }
                | Action::Reask { .. }
                | Action::Reissue
                | Action::EndStream
                | Action::AskAgain { .. } => {}
            }
        }
        Proposal::Stopped
    }

    /// Whether the last decision said not to offer `tool` (its circuit is open).
    pub fn hidden(&self, tool: &str) -> bool {
        self.hidden.iter().any(|t| t == tool)
    }

    /// The tools the last decision said not to offer.
    pub fn hidden_tools(&self) -> &[String] {
        &self.hidden
    }

    /// The guidance of the last decision.
    pub fn guidance(&self) -> &[Guidance] {
        &self.guidance
    }

    /// Steps whose value changed when read again before answering (see
    /// [`Run::contested`]).
    pub fn contested(&self) -> &[Option<u32>] {
        self.run.contested()
    }

    /// Ends the run.
    pub fn finish(&mut self, now_ms: u64) -> RunOutcome {
        self.run.finish(now_ms)
    }

    /// The evidence about its sources the run saw, for the trust store kept across episodes.
    pub fn take_trust_evidence(&mut self) -> Vec<TrustReport> {
        self.run.take_trust_evidence()
    }

    /// The run's trace.
    pub fn trace(&self) -> &Trace {
        self.run.trace()
    }
}
