package main

import "testing"

func TestEnding(t *testing.T) {
	cases := []struct {
		command string
		seconds float64
		code    int32
		ends    bool
	}{
		{"sleep 5", 5, 0, true},
		{"/bin/sleep 0.5", 0.5, 0, true},
		{"sh -c sleep 3 && echo done", 3, 0, true},
		{"sh -c sleep 2; exit 3", 2, 3, true},
		{"sh -c sleep '1.5' && exit 1", 1.5, 1, true},
		{"sh -c exit 1", 0, 1, true},
		{"sh -c exit 256", 0, 0, true},
		{"sleep infinity", 0, 0, false}, // runs until stopped, not "exits at once"
		{"sleep inf; exit 1", 0, 0, false},
		{"sleep NaN", 0, 0, false},
		{"sleep -1", 0, 0, false},
		{"run-forever", 0, 0, false},
	}
	for _, c := range cases {
		seconds, code, ends := ending(c.command)
		if ends != c.ends || (ends && (seconds != c.seconds || code != c.code)) {
			t.Errorf("ending(%q) = %v, %v, %v; want %v, %v, %v", c.command, seconds, code, ends, c.seconds, c.code, c.ends)
		}
	}
}
