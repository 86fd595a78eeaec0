"""Other projects' own test suites, run against tubeq as they run against beanstalkd."""
