"""Differential wire tests: scripted raw-TCP conversations run against beanstalkd and tubeq."""
