"""The turn: one question answered by the Answerer (limits, capacity, the thread's lock, the query pipeline, history)."""
