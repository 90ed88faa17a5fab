"""Agent tasks: an instruction carried out in a prepared environment (a repository, a terminal
task), graded after the episode in a fresh copy that carries only the agent's changes, with hidden
tests brought in from the host and the verdict read from the verifier's own run."""
