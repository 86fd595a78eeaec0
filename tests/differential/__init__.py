"""Differential tests: the same bytes sent to beanstalkd 1.12 and to the target (tubeq), the
replies compared: the scripted raw-TCP scenarios (harness, scenarios_*) and the README's terminal
session."""
