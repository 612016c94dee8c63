"""Message-queue providers for the common-messaging provider's ``MessageQueueTrigger``."""
