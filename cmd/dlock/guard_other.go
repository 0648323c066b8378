//go:build unix && !linux

package main

import "os"

// guardSetup has nothing to set up here: without a subreaper, the guard
// kills CMD's process group only.
func guardSetup() {}

// guardChildren is nil: only CMD is the guard's child here, and group
// kills cover it.
func guardChildren() []int { return nil }

// selfExecutable is the file to re-execute as the guard.
func selfExecutable() (string, error) { return os.Executable() }
