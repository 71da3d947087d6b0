"""Issue 10's fuzz suite: bad input to every public function and CLI command, on both backends."""
