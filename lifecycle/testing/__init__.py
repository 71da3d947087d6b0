"""The kit users run in their CI: strategies, a ready state machine, storage case suites (needs statebook[testing])."""
