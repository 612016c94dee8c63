"""AMQP 1.0 topology management against real RabbitMQ 4.3 and 4.0 brokers."""
