"""tubeq.client: the bundled client, consume() and tubeq-cli, against beanstalkd 1.12 and tubeq."""
