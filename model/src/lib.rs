pub mod db;
pub mod ids;
pub mod status;
pub mod stream;
pub mod time;
