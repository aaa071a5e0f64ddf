"""The elastic controller: routing table, Redis slot moves, executor requests."""
