"""Other beanstalkd clients against tubeq and beanstalkd 1.12: Python libraries in process, and
the Node, PHP and Ruby scripts of this folder run for real."""
