"""Protocol clients (no Airflow, no Spark): RabbitMQ Streams and TubeMQ."""
