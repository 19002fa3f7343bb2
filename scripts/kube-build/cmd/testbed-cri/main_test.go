package main

import "testing"

func TestSleepSeconds(t *testing.T) {
	cases := []struct {
		command string
		seconds float64
		sleeps  bool
	}{
		{"sleep 5", 5, true},
		{"/bin/sleep 0.5", 0.5, true},
		{"sh -c sleep 3 && echo done", 3, true},
		{"sleep infinity", 0, false}, // runs until stopped, not "exits at once"
		{"sleep inf", 0, false},
		{"sleep NaN", 0, false},
		{"sleep -1", 0, false},
		{"run-forever", 0, false},
	}
	for _, c := range cases {
		seconds, sleeps := sleepSeconds(c.command)
		if sleeps != c.sleeps || (sleeps && seconds != c.seconds) {
			t.Errorf("sleepSeconds(%q) = %v, %v; want %v, %v", c.command, seconds, sleeps, c.seconds, c.sleeps)
		}
	}
}
